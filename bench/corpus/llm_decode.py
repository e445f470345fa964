"""The LLM harness: a 4-step greedy decode of an ONNX decoder, checked step by step.

Why: issue 17 asks that a fused decoder give the original's logits at every step of a
greedy decode through its KV cache, not only on one prefill. Every LLM corpus model
(``export_llm.py``) has a ``decode.npz`` beside it (``_llm_families.reference``: the
prompt, torch's logits of the prefill and of 4 one-token steps, the tokens fed); this
module runs the same decode in onnxruntime and compares. Fusions of the attention, the
rotary embeddings and the norms are all checked by it (``check_decode``).

Two kinds of graph, told apart by their inputs:

* with a KV cache (inputs ``past_key_values.<i>.key|value``, outputs ``present.<i>...``,
  as optimum-onnx and ``export_llm``'s dynamo export name them): the prefill starts from
  an empty past (length 0), then each step feeds one token, the presents as the pasts,
  an all-ones ``attention_mask`` of past + 1 and, when the graph takes it,
  ``position_ids``;
* a prefill graph (``input_ids``, ``attention_mask`` -> ``logits``): each step runs the
  whole sequence so far and keeps the last position's logits.

The tokens fed are torch's (teacher forcing), so a near tie in random weights cannot make
two runs diverge; the argmax of each step is compared too, unless the reference's top two
logits are closer than the tolerance. A graph with a KV cache also decodes a batch of
two, the second row left-padded (``padded_decode``: a server's batch of prompts of two
lengths), fused against original at every step, at the real positions (issue 24).

    python bench/corpus/llm_decode.py MODEL_DIR [FUSED.onnx]   # prints the max diffs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

DECODE_FILE = "decode.npz"
ATOL, RTOL = 1e-4, 1e-4
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


def load_reference(model_dir: Path) -> dict[str, np.ndarray]:
    with np.load(Path(model_dir) / DECODE_FILE) as arrays:
        return {k: arrays[k] for k in arrays.files}


def session(path: Path, *, optimized: bool = False, threads: int = 1) -> ort.InferenceSession:
    """onnxruntime on CPU, graph optimizations off unless ``optimized``."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimized
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _present_name(past: str) -> str:
    return past.replace("past_key_values.", "present.", 1)


def greedy_decode(sess: ort.InferenceSession, ref: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The logits of the prefill and of each step, feeding ``ref``'s prompt and tokens."""
    names = [i.name for i in sess.get_inputs()]
    outputs = [o.name for o in sess.get_outputs()]
    logits_at = outputs.index("logits") if "logits" in outputs else 0
    pasts = [n for n in names if _PAST.match(n)]
    ids = ref["input_ids"].astype(np.int64)
    tokens = [int(t) for t in ref["tokens"]]
    if not pasts:
        return _decode_without_cache(sess, names, logits_at, ids, tokens)
    batch = ids.shape[0]
    shape = (batch, int(ref["num_kv_heads"]), 0, int(ref["head_dim"]))
    cache = {n: np.zeros(shape, np.float32) for n in pasts}
    result, length, step_ids = [], 0, ids
    for step in range(len(tokens) + 1):
        new = step_ids.shape[1]
        feeds = {
            "input_ids": step_ids,
            "attention_mask": np.ones((batch, length + new), np.int64),
            **cache,
        }
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(length, length + new, dtype=np.int64)[None]
        got = dict(zip(outputs, sess.run(None, feeds), strict=True))
        result.append(got[outputs[logits_at]])
        cache = {n: got[_present_name(n)] for n in pasts}
        length += new
        if step < len(tokens):
            step_ids = np.array([[tokens[step]]] * batch, np.int64)
    return result


PAD = 3  # left padding of the second row of the padded batch


def padded_batch(ref: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A batch of two: ``ref``'s prompt, and its last tokens left-padded by ``PAD``
    (token 0, masked), as a server batches prompts of different lengths."""
    ids = ref["input_ids"].astype(np.int64)[:1]
    shorter = np.concatenate([np.zeros((1, PAD), np.int64), ids[:, PAD:]], axis=1)
    mask = np.ones((2, ids.shape[1]), np.int64)
    mask[1, :PAD] = 0
    return np.concatenate([ids, shorter]), mask


def padded_decode(sess: ort.InferenceSession, ref: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The logits of a 4-step greedy decode of ``padded_batch`` through the cache (the
    positions counted from each row's first real token, as generate() does), with the
    padded positions' logits set to 0: nothing reads them."""
    names = [i.name for i in sess.get_inputs()]
    outputs = [o.name for o in sess.get_outputs()]
    logits_at = outputs.index("logits") if "logits" in outputs else 0
    pasts = [n for n in names if _PAST.match(n)]
    ids, mask = padded_batch(ref)
    tokens = [int(t) for t in ref["tokens"]]
    shape = (2, int(ref["num_kv_heads"]), 0, int(ref["head_dim"]))
    cache = {n: np.zeros(shape, np.float32) for n in pasts}
    result, step_ids = [], ids
    for step in range(len(tokens) + 1):
        new = step_ids.shape[1]
        feeds = {"input_ids": step_ids, "attention_mask": mask, **cache}
        if "position_ids" in names:
            positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
            feeds["position_ids"] = positions[:, -new:]
        got = dict(zip(outputs, sess.run(None, feeds), strict=True))
        logits = got[outputs[logits_at]].copy()
        logits[mask[:, -new:] == 0] = 0.0
        result.append(logits)
        cache = {n: got[_present_name(n)] for n in pasts}
        if step < len(tokens):
            step_ids = np.array([[tokens[step]]] * 2, np.int64)
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    return result


def _decode_without_cache(sess, names, logits_at, ids, tokens) -> list[np.ndarray]:
    result = []
    for step in range(len(tokens) + 1):
        seq = np.concatenate([ids, np.array([tokens[:step]], np.int64)], axis=1)
        feeds = {"input_ids": seq}
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones_like(seq)
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(seq.shape[1], dtype=np.int64)[None]
        logits = sess.run(None, feeds)[logits_at]
        result.append(logits if step == 0 else logits[:, -1:])
    return result


def compare_steps(
    got: list[np.ndarray],
    expected: list[np.ndarray],
    label: str,
    *,
    atol: float = ATOL,
    rtol: float = RTOL,
) -> tuple[float, list[str]]:
    """(max abs diff, problems) of each step's logits: |got - expected| <= atol + rtol *
    |expected| everywhere, the same shape, the same argmax where the top two differ."""
    worst, problems = 0.0, []
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        if a.shape != b.shape:
            problems.append(f"{label} step {step}: shape {a.shape}, expected {b.shape}")
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        bound = atol + rtol * np.abs(b.astype(np.float64))
        worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
        if not np.all(diff <= bound):  # NaN fails too
            problems.append(
                f"{label} step {step}: max abs diff {float(np.nanmax(diff)):.3g} "
                f"(atol {atol}, rtol {rtol})"
            )
            continue
        last_a, last_b = a[:, -1], b[:, -1]
        top2 = np.sort(last_b, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * (atol + rtol * np.abs(top2[:, 1]))
        if np.any(clear & (last_a.argmax(-1) != last_b.argmax(-1))):
            problems.append(f"{label} step {step}: a different greedy token")
    return worst, problems


def reference_steps(ref: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [ref[f"logits{i}"] for i in range(len(ref["tokens"]) + 1)]


def check_decode(
    model_dir: Path,
    fused: Path | None = None,
    *,
    atol: float = ATOL,
    rtol: float = RTOL,
    optimized: bool = False,
) -> tuple[dict[str, float], list[str]]:
    """Decode ``model_dir/model.onnx`` (and ``fused``) in onnxruntime: (max abs diff per
    comparison, problems). The original is compared with torch's logits; the fused model
    with torch's and with the original's, at every step. ``optimized``: onnxruntime's
    graph optimizations on (off by default: what is compared is the graph itself)."""
    model_dir = Path(model_dir)
    ref = load_reference(model_dir)
    expected = reference_steps(ref)
    original = greedy_decode(session(model_dir / "model.onnx", optimized=optimized), ref)
    diffs, problems = {}, []
    diffs["original_vs_torch"], found = compare_steps(
        original, expected, "original vs torch", atol=atol, rtol=rtol
    )
    problems += found
    if fused is not None:
        fused_sess = session(Path(fused), optimized=optimized)
        got = greedy_decode(fused_sess, ref)
        for label, other in (("fused vs original", original), ("fused vs torch", expected)):
            key = label.replace(" ", "_")
            diffs[key], found = compare_steps(got, other, label, atol=atol, rtol=rtol)
            problems += found
        if any(_PAST.match(i.name) for i in fused_sess.get_inputs()):
            label = "padded batch of two, fused vs original"
            diffs["padded_fused_vs_original"], found = compare_steps(
                padded_decode(fused_sess, ref),
                padded_decode(session(model_dir / "model.onnx", optimized=optimized), ref),
                label,
                atol=atol,
                rtol=rtol,
            )
            problems += found
    return diffs, problems


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    fused = Path(argv[1]) if len(argv) > 1 else None
    diffs, problems = check_decode(Path(argv[0]), fused)
    for key, value in diffs.items():
        print(f"{key}: max abs diff {value:.3g}")
    for problem in problems:
        print(f"FAIL {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
