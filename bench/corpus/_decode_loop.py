"""The padded decode on onnxruntime: a graph's cache states started and carried as a
generation loop does, the prefill and the one-token steps.

Why: a fusion that mishandles padding, positions or a cache that grows step by step
shows only in a real generation loop. A state whose name ends in ``key``, ``value`` or
``indexer_key`` (a sparse attention's indexer) grows along its length axis and starts
empty; a convolution or recurrent state has a fixed size, starts at zeros and is carried
from ``present.*`` to ``past_key_values.*`` as is. A graph exported for one new token is
prefilled one token at a time, and one whose batch the export fixed to 1 runs each row
alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ for the decode loop
from _decoder_steps import positions

PAST, PRESENT = "past_key_values.", "present."
# the kinds that grow, and their length axis: _kv_states.LENGTH_AXES (imported there with torch)
GROWING = {"key": 2, "value": 2, "indexer_key": 1}


def state_kind(name: str) -> str:
    """``past_key_values.{layer}.{kind}[.{index}]`` -> kind."""
    return name.split(".")[2]


def empty_state(name: str, shape: list, batch: int, dtype=np.float32) -> np.ndarray:
    """The state before any token: keys, values and indexer keys of length 0, a
    fixed-size state (convolution, recurrent) of zeros. Every dim but the batch and the
    growing length must be a number in the graph."""
    dims = list(shape)
    dims[0] = batch
    kind = state_kind(name)
    if kind in GROWING:
        dims[GROWING[kind]] = 0
    unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if unknown:
        raise ValueError(
            f"{name}: dims {unknown} of {shape} are not numbers, so its empty state has "
            "no size; export the graph with those dims static"
        )
    return np.zeros(dims, dtype)


def carry(outputs: dict[str, np.ndarray], inputs: list[str]) -> dict[str, np.ndarray]:
    """Each ``present.X`` becomes the next step's ``past_key_values.X``, grown or not."""
    state = {PAST + n[len(PRESENT) :]: v for n, v in outputs.items() if n.startswith(PRESENT)}
    missing = sorted(set(inputs) - set(state))
    if missing:
        raise ValueError(f"the graph takes {missing} but outputs no present state for them")
    return {name: state[name] for name in inputs}


class Decoder:
    """One session and its cache; ``step`` feeds new tokens and the whole mask so far."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.args = self.session.get_inputs()
        self.names = {arg.name for arg in self.args}
        self.outputs = [out.name for out in self.session.get_outputs()]
        self.past = [arg.name for arg in self.args if arg.name.startswith(PAST)]
        self.cache: dict[str, np.ndarray] = {}
        ids = next(arg for arg in self.args if arg.name == "input_ids")
        if isinstance(ids.shape[1], int) and ids.shape[1] != 1:
            raise ValueError(
                f"{path.name} takes exactly {ids.shape[1]} new tokens a call (the export "
                "fixed the count), so neither a prefill nor a one-token step can be fed"
            )
        self.one_token = ids.shape[1] == 1  # exported for generate's step only
        self.one_row = ids.shape[0] == 1  # torch.onnx fixed the batch to the traced 1

    def start(self, batch: int) -> None:
        """An empty cache for ``batch`` rows."""
        self.cache = {
            a.name: empty_state(a.name, a.shape, batch) for a in self.args if a.name in self.past
        }

    def step(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask, **self.cache}
        if "position_ids" in self.names:
            feed["position_ids"] = positions(mask, ids.shape[1])
        result = dict(zip(self.outputs, self.session.run(None, feed), strict=True))
        self.cache = carry(result, self.past)
        return result["logits"]

    def prefill(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if not self.one_token:
            return self.step(ids, mask)
        columns = [self.step(ids[:, i : i + 1], mask[:, : i + 1]) for i in range(ids.shape[1])]
        return np.concatenate(columns, axis=1)


def generate(decoder: Decoder, ids, mask, steps: int, tokens=None):
    """The prefill from an empty cache, then ``steps`` one-token steps."""
    decoder.start(ids.shape[0])
    logits = [decoder.prefill(ids, mask)]
    chosen = []
    for step in range(steps):
        token = tokens[step] if tokens is not None else logits[-1][:, -1].argmax(-1)
        chosen.append(token)
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
        logits.append(decoder.step(token.astype(np.int64)[:, None], mask)[:, -1:])
    return logits, chosen


def run_steps(path: Path, ids, mask, steps: int, tokens=None):
    """Logits of the prefill (every position) and of each step; with ``tokens`` None
    each step feeds the variant's own argmax, and the tokens are returned. A graph whose
    batch the export fixed to 1 runs each row alone (the padded row still padded)."""
    decoder = Decoder(path)
    if not decoder.one_row:
        return generate(decoder, ids, mask, steps, tokens)
    rows = [
        generate(
            decoder,
            ids[r : r + 1],
            mask[r : r + 1],
            steps,
            tokens and [t[r : r + 1] for t in tokens],
        )
        for r in range(ids.shape[0])
    ]
    logits = [
        np.concatenate(parts, axis=0) for parts in zip(*(row[0] for row in rows), strict=True)
    ]
    chosen = [np.concatenate(parts) for parts in zip(*(row[1] for row in rows), strict=True)]
    return logits, chosen
