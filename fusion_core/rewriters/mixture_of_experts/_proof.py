"""What a mixture-of-experts block computes, proven by running it.

The block's ops say little on their own (``_block.py``); what it must compute is::

    p = softmax(logits)                       # over the experts
    chosen, w = top_k(p)                      # w renormalized to sum 1, or not
    y[t] = sum_j w[t, j] * down[e](silu(gate[e] @ x[t]) * (up[e] @ x[t])),  e = chosen[t, j]

with ``gate``, ``up`` and ``down`` read from the stacked weights. Which weight is which,
which half of a fused gate/up weight is the gate, and whether the weights are
renormalized are hypotheses; each is tried against the block itself, run by onnxruntime
on random tokens and logits (with the model's own weights, so only the experts the
tokens choose are touched). The one that reproduces the block (rtol 1e-4, atol 1e-5 of
the output's scale) is kept, then checked once more against ``com.microsoft.MoE``
itself, the kernel the rewrite emits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block, StackedWeight

__all__ = ["Experts", "prove"]

RTOL, ATOL = 1e-4, 1e-5
_TOKENS = (2, 3)  # the random inputs: 2 sequences of 3 tokens (or 6 tokens)
# The largest weight slice the proof gathers (tokens x top-k experts), in elements.
_PROOF_ELEMENTS = 400_000_000


@dataclass
class Experts:
    """The experts as com.microsoft.MoE takes them (CPU: SwiGLU, gate/up interleaved)."""

    k: int
    normalize: bool
    fc1: np.ndarray  # [experts, 2 * inter, hidden]: gate and up rows interleaved
    fc2: np.ndarray  # [experts, hidden, inter]


def _out_in(weight: StackedWeight) -> np.ndarray:
    """The weight as [experts, out, in]."""
    array = constant_array(weight.array_value)
    return array if weight.weight_first else np.swapaxes(array, 1, 2)


def _hypotheses(block: Block):
    """(gate, up, down, normalize) candidates, each [experts, out, in]."""
    if block.units:  # which is the gate is known: what the silu reads
        gate, up, down = (
            np.stack([getattr(u, part).T for u in block.units]) for part in ("gate", "up", "down")
        )
        return [(gate, up, down, norm) for norm in (True, False)]
    position = {id(n): i for i, n in enumerate(block.nodes)}  # graph order
    ordered = sorted(block.weights, key=lambda w: position[id(w.matmul)])
    arrays = [_out_in(w) for w in ordered]
    if len(arrays) == 2:
        fused, down = arrays
        if fused.shape[1] % 2:
            return []
        half = fused.shape[1] // 2
        pairs = [(fused[:, :half], fused[:, half:]), (fused[:, half:], fused[:, :half])]
    elif len(arrays) == 3:
        first, second, down = arrays
        pairs = [(first, second), (second, first)]
    else:
        return []
    return [(g, u, down, norm) for (g, u), norm in itertools.product(pairs, (True, False))]


def reference(
    x: np.ndarray, logits: np.ndarray, gate, up, down, k: int, normalize: bool
) -> np.ndarray:
    """The mixture of experts of ``x`` [tokens, hidden], in numpy (float64)."""
    scores = logits.astype(np.float64)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, chosen, -1)
    if normalize:
        w /= w.sum(-1, keepdims=True)
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(k):
            e = chosen[t, j]
            g = gate[e].astype(np.float64) @ x[t]
            u = up[e].astype(np.float64) @ x[t]
            out[t] += w[t, j] * (down[e].astype(np.float64) @ (g / (1 + np.exp(-g)) * u))
    return out


def _close(expected: np.ndarray, got: np.ndarray) -> bool:
    if expected.shape != got.shape:
        return False
    scale = float(np.abs(expected).max()) or 1.0
    return bool(np.allclose(got, expected, rtol=RTOL, atol=ATOL * scale))


def prove(block: Block, k: int, opsets: dict[str, int]) -> Experts | str:
    """The experts the block computes with, or why it is not a mixture of experts."""
    import onnxruntime as ort  # only a block that looks like experts pays for it

    hypotheses = _hypotheses(block)
    if not hypotheses:
        return "the stacked weights are not a fused gate/up pair or a gate, an up and a down"
    gate0, _, down0, _ = hypotheses[0]
    cost = int(np.prod(_TOKENS)) * k * (2 * gate0[0].size + down0[0].size)
    if cost > _PROOF_ELEMENTS:
        return "the experts are too large to prove by running the block"
    feeds, x, logits = _random_inputs(block)
    if isinstance(feeds, str):
        return feeds
    try:
        session = ort.InferenceSession(
            _block_model(block, opsets).SerializeToString(),
            _options(ort),
            providers=["CPUExecutionProvider"],
        )
        (got,) = session.run(None, feeds)
    except Exception as exc:
        return f"onnxruntime cannot run the block on its own ({type(exc).__name__})"
    if got.shape != x.shape:
        return f"the block's output has shape {list(got.shape)}, its input {list(x.shape)}"
    for gate, up, down, normalize in hypotheses:
        if gate.shape[1:] != (down.shape[2], x.shape[1]) or down.shape[1] != x.shape[1]:
            continue
        if _close(reference(x, logits, gate, up, down, k, normalize), got):
            experts = _as_moe(k, normalize, gate, up, down)
            return _kernel_agrees(ort, experts, x, logits, got)
    return (
        "the block does not compute softmax, top-k and SwiGLU experts (silu(gate) * up, "
        "then down) with its stacked weights"
    )


def _as_moe(k: int, normalize: bool, gate, up, down) -> Experts:
    experts, inter, hidden = gate.shape
    fc1 = np.empty((experts, 2 * inter, hidden), gate.dtype)
    fc1[:, 0::2], fc1[:, 1::2] = gate, up  # the CPU kernel's interleaved SwiGLU
    return Experts(k, normalize, fc1, np.ascontiguousarray(down))


def moe_attributes(experts: Experts) -> dict:
    return {
        "k": experts.k,
        "activation_type": "swiglu",
        "swiglu_fusion": 1,
        "normalize_routing_weights": int(experts.normalize),
    }


def _kernel_agrees(ort, experts: Experts, x, logits, expected) -> Experts | str:
    """The MoE kernel on the same inputs gives what the block gave."""
    node = onnx.helper.make_node(
        "MoE",
        ["x", "logits", "fc1", "", "fc2", ""],
        ["y"],
        domain="com.microsoft",
        **moe_attributes(experts),
    )
    f = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(
        [node],
        "moe",
        [onnx.helper.make_tensor_value_info(n, f, None) for n in ("x", "logits", "fc1", "fc2")],
        [onnx.helper.make_tensor_value_info("y", f, None)],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", 17),
            onnx.helper.make_opsetid("com.microsoft", 1),
        ],
    )
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), _options(ort), providers=["CPUExecutionProvider"]
        )
        (got,) = session.run(
            None, {"x": x, "logits": logits, "fc1": experts.fc1, "fc2": experts.fc2}
        )
    except Exception as exc:
        return f"onnxruntime's MoE kernel cannot run these experts ({type(exc).__name__})"
    if not _close(expected.astype(np.float64), got):
        return "onnxruntime's MoE kernel does not reproduce the block"
    return experts


def _options(ort):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return options


def _random_inputs(block: Block):
    """Feeds for the block model: the root of the hidden states, the logits, every
    constant it reads, and zeros shaped like what it only reads the shape of; and the
    hidden states and logits as the experts see them."""
    rng = np.random.default_rng(0)
    shape = block.root.shape
    width = block.hidden.shape[-1] if block.hidden.shape is not None else None
    if shape is None or not isinstance(width, int):
        return "the hidden states have no known width", None, None
    dims, symbolic, sizes = [], iter(_TOKENS), {}
    for dim in shape[:-1]:
        if not isinstance(dim, int):
            sizes[str(dim)] = next(symbolic, 1)
        dims.append(dim if isinstance(dim, int) else sizes[str(dim)])
    tokens = int(np.prod(dims))
    root = rng.standard_normal((*dims, width)).astype(np.float32)
    logits = rng.standard_normal((tokens, block.experts)).astype(np.float32)
    feeds = {block.root.name: root, block.logits.name: logits}
    for value in _external(block):
        if value.name in feeds:
            continue
        array = constant_array(value)
        if array is None:
            array = _sized(value, block, sizes)
        if isinstance(array, str):
            return array, None, None
        feeds[value.name] = array
    return feeds, root.reshape(tokens, width), logits


def _sized(value: ir.Value, block: Block, sizes: dict[str, int]) -> np.ndarray | str:
    """Zeros shaped like ``value``, which the block reads only the shape of (a graph
    input's batch and sequence, named like the hidden states' dims)."""
    readers = [u.node for u in value.uses() if any(u.node is n for n in block.nodes)]
    if not readers or any(n.op_type not in ("Shape", "Size") for n in readers):
        return f"the block reads {value.name!r}, which is not a constant"
    if value.shape is None or value.dtype is None:
        return f"the block reads the shape of {value.name!r}, which is not known"
    dims = []
    for dim in value.shape:
        if not isinstance(dim, int) and str(dim) not in sizes:
            return f"the block reads the shape of {value.name!r}, whose {dim} it cannot size"
        dims.append(dim if isinstance(dim, int) else sizes[str(dim)])
    return np.zeros(dims, value.dtype.numpy())


def _external(block: Block) -> list[ir.Value]:
    """The values the block's nodes read that none of them computes."""
    made = {id(v) for n in block.nodes for v in n.outputs}
    seen: dict[int, ir.Value] = {}
    for node in block.nodes:
        for value in node.inputs:
            if value is not None and id(value) not in made:
                seen.setdefault(id(value), value)
    return list(seen.values())


def _block_model(block: Block, opsets: dict[str, int]) -> onnx.ModelProto:
    """The block alone, its constants as inputs (so no weight is copied into it)."""
    inputs = [
        onnx.helper.make_tensor_value_info(
            v.name, int(v.dtype) if v.dtype is not None else onnx.TensorProto.FLOAT, None
        )
        for v in _external(block)
    ]
    output = onnx.helper.make_tensor_value_info(block.output.name, onnx.TensorProto.FLOAT, None)
    graph = onnx.helper.make_graph(
        [ir.serde.serialize_node(n) for n in block.nodes], "moe_block", inputs, [output]
    )
    imports = [onnx.helper.make_opsetid(d, v) for d, v in opsets.items()]
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=8)
