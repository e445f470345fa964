"""A multi-step greedy decode with padding, batch 2: a variant's logits against the original's.

Why: one decode step with a full mask (``bench_real_big_decoder.decode_diffs``) cannot
see a fusion that mishandles padding, positions or a cache that grows step by step.
Here a batch of two prompts, the second left-padded, is prefilled with an empty cache,
then ``steps`` one-token steps feed each row the original's argmax and carry the
``present.*`` outputs into the ``past_key_values.*`` inputs, as a generation loop does.
The attention mask is ``[batch, past + new]`` with 0 on the padding and 1 elsewhere; the
position ids (where a graph takes them) are transformers' ``generate``'s: the running
count of the mask minus one, 1 on padding. Every variant is fed the original's tokens (so
a near tie cannot send two variants down different paths); compared are the logits of
every non-padding position of the prefill and of each step's token. One session alive
at a time, the original's logits kept (9 x 2 x vocabulary floats).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

PAD = 0


def prompts(batch: int, length: int, padding: int, seed: int = 0):
    """Token ids and mask: row 0 full, every other row left-padded by ``padding``."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 200, (batch, length), dtype=np.int64)
    mask = np.ones((batch, length), np.int64)
    mask[1:, :padding] = 0
    ids[mask == 0] = PAD
    return ids, mask


def positions(mask: np.ndarray, new: int) -> np.ndarray:
    """transformers' ``generate`` positions of the last ``new`` tokens."""
    pos = np.cumsum(mask, axis=-1) - 1
    pos[mask == 0] = 1
    return pos[:, -new:]


def empty_cache(session: ort.InferenceSession, batch: int) -> dict[str, np.ndarray]:
    cache = {}
    for arg in session.get_inputs():
        if arg.name.startswith("past_key_values."):
            heads, dim = arg.shape[1], arg.shape[3]
            cache[arg.name] = np.zeros((batch, heads, 0, dim), np.float32)
    return cache


def run_steps(path: Path, ids, mask, steps: int, tokens=None):
    """Logits (prefill's and each step's last) of one variant; with ``tokens`` None the
    greedy tokens are its own argmax and are returned."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {arg.name for arg in session.get_inputs()}
    outputs = [out.name for out in session.get_outputs()]
    cache, new_ids, own = empty_cache(session, ids.shape[0]), ids, []
    logits = []
    for step in range(steps + 1):
        feed = {"input_ids": new_ids, "attention_mask": mask, **cache}
        if "position_ids" in names:
            feed["position_ids"] = positions(mask, new_ids.shape[1])
        result = dict(zip(outputs, session.run(None, feed), strict=True))
        logits.append(result["logits"] if step == 0 else result["logits"][:, -1:])
        cache = {
            name.replace("present.", "past_key_values."): value
            for name, value in result.items()
            if name.startswith("present.")
        }
        chosen = tokens[step] if tokens is not None else result["logits"][:, -1].argmax(-1)
        own.append(chosen)
        new_ids = chosen.astype(np.int64)[:, None]
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
    return logits, own


def compare(logits: list, base: list, mask: np.ndarray) -> dict:
    """Max abs differences: the prefill's real positions, the decode steps, each row's."""
    prefill = np.abs(logits[0] - base[0])[mask == 1]
    pairs = zip(logits[1:], base[1:], strict=True)
    decode = np.stack([np.abs(a - b).max(axis=(1, 2)) for a, b in pairs])
    return {  # decode: [steps, batch]
        "prefill_max_abs": float(prefill.max()),
        "decode_max_abs": float(decode.max()),
        "decode_max_abs_by_row": [float(v) for v in decode.max(axis=0)],
        "decode_per_step": [float(f"{v:.3g}") for v in decode.max(axis=1)],
        "original_logits_max_abs": max(float(np.abs(b).max()) for b in base),  # the scale
    }


def steps_diffs(
    paths: dict[str, Path], *, batch: int = 2, length: int = 16, padding: int = 5, steps: int = 8
) -> dict[str, dict]:
    """Per variant: max abs difference of its logits from the original's (the first
    variant), over the prefill's real positions and over the decode steps."""
    ids, mask = prompts(batch, length, padding)
    labels = iter(paths)
    base, tokens = run_steps(paths[next(labels)], ids, mask, steps)
    return {
        label: compare(run_steps(paths[label], ids, mask, steps, tokens)[0], base, mask)
        for label in labels
    }
