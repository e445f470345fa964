"""A synthetic decoder of any size, with external data, built in seconds (issue 29).

``make_decoder(folder, shape)`` writes ``decoder.onnx`` and ``decoder.onnx.data``: a
Llama-shaped decoder (no torch, no download) whose weights are seeded random numbers,
streamed into the data file one initializer at a time, so building a model of several
GB holds one weight matrix in memory, never the model. ``shape_for_size(bytes)`` picks
the hidden size, heads and layers that bring the weights to a size.

The graph is written as the exporters write a Hugging Face Llama (optimum's TorchScript
export, prefill without a cache), each layer::

    h = h + o_proj(attention(rotary(q_proj(rms(h))), rotary(k_proj(rms(h))), v_proj(rms(h))))
    h = h + down_proj(silu(gate_proj(rms(h))) * up_proj(rms(h)))

* RMSNorm as ``Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma)``;
* rotary: rotate-half with the angles ``position_ids x inv_freq`` computed once;
* attention: grouped KV heads repeated by ``Unsqueeze -> Expand -> Reshape`` (repeat_kv),
  the scores scaled by ``1 / sqrt(head_size)``, the causal and padding mask computed once
  as ``Where(allowed, 0, lowest)`` and added, Softmax, the context merged back;
* SwiGLU: ``Mul(gate, Sigmoid(gate)) * up``;
* the embedding (``Gather`` of ``input_ids``), a final norm and the lm head.

Inputs: ``input_ids``, ``attention_mask`` and ``position_ids``, ``int64[batch, seq]``;
output ``logits`` ``float[batch, seq, vocab]``. The engine fuses each layer's attention
into one GroupQueryAttention with two RotaryEmbeddings on the onnxruntime target.

Weight types (``bench/_big_weights.py``): fp32; fp16, the whole model in fp16 as an fp16
export writes it (the norms computed in fp32 between two Casts and the rotary angles in
fp32 cast to fp16, as transformers' Llama does; the attention in fp16, as its sdpa path
exports); int4, every projection and the lm head a ``com.microsoft.MatMulNBits`` as
onnxruntime-genai's model builder writes int4 (activations fp32). ``PRESETS["7b"]`` is
Llama-2-7B / Mistral-7B's shape with Mistral's 8 KV heads (GQA).

Weights are ``standard_normal / sqrt(fan_in)`` (activations neither vanish nor blow
up over the layers) and the norms' gammas ``uniform(0.5, 1.5)``: nothing an identity
would pass for. The bench (``bench/make_big_decoder.py``, ``bench/bench_big_models.py``)
and the tests (``tests/bench/test_big_models.py``, a model of a few MB) build it here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
from _big_weights import BITS, FP32, Weights, quantize_random

MODEL_FILE = "decoder.onnx"
OPSET = 18
_ALIGN = 4096  # each tensor starts on a page, so onnxruntime and onnx-ir can map it
_F32, _F16, _I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT64


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    layers: int

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        kv = self.kv_heads * self.head_size
        attention = self.hidden * (2 * self.hidden + 2 * kv)
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def weight_bytes(self) -> int:
        """Bytes of float32 weights (the data file holds these, page-aligned)."""
        outer = 2 * self.vocab * self.hidden + self.hidden
        return 4 * (outer + self.layers * self.layer_params)

    def projections(self) -> list[tuple[int, int]]:
        """Each layer's projections, ``(fan in, fan out)``: q, k, v, o, gate, up, down."""
        h, kv, i = self.hidden, self.kv_heads * self.head_size, self.intermediate
        return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]

    def layer_bytes(self, weights: Weights) -> int:
        return sum(weights.matrix_bytes(*p) for p in self.projections()) + 2 * (
            weights.vector_bytes(self.hidden)
        )

    def stored_bytes(self, weights: Weights) -> int:
        """Bytes of the weights as ``weights`` stores them (the embedding a float table)."""
        embed = self.vocab * self.hidden * weights.vector_bytes(1)
        outer = embed + weights.matrix_bytes(self.hidden, self.vocab)
        return outer + weights.vector_bytes(self.hidden) + self.layers * self.layer_bytes(weights)


# Llama-2-7B's and Mistral-7B's shape (hidden 4096, 32 layers, 32 query heads of 128,
# intermediate 14336, vocabulary 32000) with Mistral's 8 KV heads: 7.2 billion weights
PRESETS = {"7b": DecoderShape(4096, 32, 8, 14336, 32000, 32)}


def shape_for_size(
    size_bytes: float, *, hidden: int | None = None, weights: Weights = FP32
) -> DecoderShape:
    """The decoder whose weights, stored as ``weights``, come closest to ``size_bytes`` (at
    least one layer): hidden 1024 with 16 query heads sharing 4 KV heads (head size 64)
    and a vocabulary of 8192 from 128 MiB of fp32 up, smaller below, so a test model
    stays a few MB."""
    if hidden is None:
        fp32 = size_bytes * 4 / weights.vector_bytes(1)  # the hidden size an fp32 model gets
        hidden = 1024 if fp32 >= 128 << 20 else (256 if fp32 >= 8 << 20 else 64)
    head_size = 64 if hidden >= 256 else 16
    if hidden % head_size or hidden < 2 * head_size:
        least = 2 * head_size
        raise ValueError(f"hidden {hidden}: give a multiple of {head_size}, at least {least}")
    heads = hidden // head_size
    kv_heads = max(1, heads // 4) if heads >= 8 else max(1, heads // 2)
    intermediate = 16 * math.ceil(hidden * 8 / 3 / 16)  # Llama's 2/3 of 4 x, rounded up
    vocab = 8192 if hidden >= 1024 else (2048 if hidden >= 256 else 256)
    shape = DecoderShape(hidden, heads, kv_heads, intermediate, vocab, layers=1)
    layer = shape.layer_bytes(weights)
    layers = max(1, round((size_bytes - shape.stored_bytes(weights) + layer) / layer))
    return DecoderShape(hidden, heads, kv_heads, intermediate, vocab, layers)


class _DataFile:
    """Initializers written to the external-data file as they are made."""

    def __init__(self, path: Path) -> None:
        self.name = path.name
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.offset = 0

    def tensor(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        data = np.ascontiguousarray(array)
        pad = -self.offset % _ALIGN
        self.file.write(b"\0" * pad)
        self.offset += pad
        self.file.write(data.tobytes())
        proto = onnx.TensorProto(name=name, dims=data.shape)
        proto.data_type = oh.np_dtype_to_tensor_dtype(data.dtype)
        proto.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.name), ("offset", self.offset),
                           ("length", data.nbytes)):  # fmt: skip
            proto.external_data.add(key=key, value=str(value))
        self.offset += data.nbytes
        return proto

    def close(self) -> None:
        self.file.close()


class _Builder:
    def __init__(self, shape: DecoderShape, data: _DataFile, seed: int, weights: Weights) -> None:
        self.shape, self.data, self.weights = shape, data, weights
        self.dtype = weights.dtype
        self.elem = _F16 if weights.kind == "fp16" else _F32  # the activations' type
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(oh.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def const(self, name: str, value: Any, dtype: Any = np.int64) -> str:
        """A small constant, kept inside the model file."""
        self.inits.append(nh.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, name: str, rows: int, cols: int) -> str:
        values = self.rng.standard_normal((rows, cols), dtype=np.float32)
        values *= np.float32(1 / math.sqrt(rows))
        self.inits.append(self.data.tensor(name, values.astype(self.dtype, copy=False)))
        return name

    def project(self, name: str, x: str, rows: int, cols: int, output: str) -> str:
        """``x @ W[rows, cols]``: a MatMul, or the builder's MatMulNBits for int4."""
        if self.weights.kind != "int4":
            return self.node("MatMul", [x, self.weight(name, rows, cols)], output)
        block = self.weights.block_size
        packed, scales = quantize_random(self.rng, rows, cols, block)
        self.inits.append(self.data.tensor(f"{name}.qweight", packed))
        self.inits.append(self.data.tensor(f"{name}.scales", scales))
        inputs = [x, f"{name}.qweight", f"{name}.scales"]
        attrs = dict(K=rows, N=cols, bits=BITS, block_size=block)
        attrs["accuracy_level"] = self.weights.accuracy_level
        node = oh.make_node("MatMulNBits", inputs, [output], name=output, **attrs)
        node.domain = "com.microsoft"
        self.nodes.append(node)
        return output

    def gamma(self, name: str) -> str:
        values = self.rng.uniform(0.5, 1.5, self.shape.hidden).astype(self.dtype)
        self.inits.append(self.data.tensor(name, values))
        return name

    def rms(self, p: str, x: str) -> str:
        """RMSNorm; in fp16 computed in fp32 between two Casts, as transformers' Llama."""
        wide = self.node("Cast", [x], f"{p}_f32", to=_F32) if self.elem == _F16 else x
        sq = self.node("Pow", [wide, "two"], f"{p}_sq")
        ms = self.node("ReduceMean", [sq, "axis_last"], f"{p}_ms", keepdims=1)
        var = self.node("Add", [ms, "eps"], f"{p}_var")
        root = self.node("Sqrt", [var], f"{p}_root")
        unit = self.node("Div", [wide, root], f"{p}_unit")
        if self.elem == _F16:
            unit = self.node("Cast", [unit], f"{p}_f16", to=_F16)
        return self.node("Mul", [unit, self.gamma(f"{p}.weight")], f"{p}_out")


def _constants(b: _Builder) -> None:
    s = b.shape
    half = s.head_size // 2
    b.const("inv_freq", 1.0 / (10000 ** (np.arange(0, s.head_size, 2) / s.head_size)), np.float32)
    b.const("two", 2.0, np.float32)
    b.const("eps", 1e-6, np.float32)
    b.const("zero_f", 0.0, b.dtype)  # the mask and the scale in the activations' type
    b.const("lowest", np.finfo(b.dtype).min, b.dtype)
    b.const("scale", s.head_size**-0.5, b.dtype)
    b.const("axis_last", [-1])
    b.const("axis_1", [1])
    b.const("axis_2", [2])
    for name, value in (("zero", [0]), ("half", [half]), ("end", [np.iinfo(np.int64).max]),
                        ("axes_kv", [0, 1, 2]), ("axes_q", [0, 1, 3]), ("axes_pad", [1, 2]),
                        ("index_1", 1), ("start", 0), ("step", 1)):  # fmt: skip
        b.const(name, value)
    b.const("q_split", [0, 0, s.heads, s.head_size])
    b.const("kv_split", [0, 0, s.kv_heads, s.head_size])
    b.const("repeat", [1, 1, s.heads // s.kv_heads, 1, 1])
    b.const("kv_merge", [0, s.heads, -1, s.head_size])
    b.const("merge", [0, 0, s.hidden])


def _shared(b: _Builder) -> None:
    """The rotary angles and the additive mask, computed once for every layer."""
    b.node("Cast", ["position_ids"], "pos", to=_F32)
    b.node("Unsqueeze", ["pos", "axis_last"], "pos_u")
    b.node("Mul", ["pos_u", "inv_freq"], "freqs")
    b.node("Concat", ["freqs", "freqs"], "emb", axis=-1)
    for f in ("cos", "sin"):  # in fp32, cast to the activations' type (transformers' Llama)
        angle = b.node(f.capitalize(), ["emb"], f)
        if b.elem == _F16:
            angle = b.node("Cast", [angle], f"{f}_f16", to=_F16)
        b.node("Unsqueeze", [angle, "axis_1"], f"{f}_u")
    b.node("Shape", ["input_ids"], "ids_shape")
    b.node("Gather", ["ids_shape", "index_1"], "seq_len", axis=0)
    b.node("Range", ["start", "seq_len", "step"], "positions")
    b.node("Unsqueeze", ["positions", "axes_kv"], "kv_u")
    b.node("Unsqueeze", ["positions", "axes_q"], "q_u")
    b.node("LessOrEqual", ["kv_u", "q_u"], "causal")
    b.node("Unsqueeze", ["attention_mask", "axes_pad"], "mask_u")
    b.node("Cast", ["mask_u"], "padding", to=onnx.TensorProto.BOOL)
    b.node("And", ["causal", "padding"], "allowed")
    b.node("Where", ["allowed", "zero_f", "lowest"], "bias")


def _heads(b: _Builder, p: str, x: str) -> dict[str, str]:
    """The projections split into heads, ``[B, heads, S, head_size]``, q and k rotated."""
    s = b.shape
    kv = s.kv_heads * s.head_size
    out = {}
    for name, cols, split in (("q", s.hidden, "q_split"), ("k", kv, "kv_split"),
                              ("v", kv, "kv_split")):  # fmt: skip
        m = b.project(f"{p}.{name}_proj", x, s.hidden, cols, f"{p}_{name}m")
        r = b.node("Reshape", [m, split], f"{p}_{name}r")
        out[name] = b.node("Transpose", [r], f"{p}_{name}t", perm=[0, 2, 1, 3])
    for name in "qk":
        t = out[name]
        lo = b.node("Slice", [t, "zero", "half", "axis_last"], f"{p}_{name}_lo")
        hi = b.node("Slice", [t, "half", "end", "axis_last"], f"{p}_{name}_hi")
        neg = b.node("Neg", [hi], f"{p}_{name}_neg")
        rot = b.node("Concat", [neg, lo], f"{p}_{name}_rot", axis=-1)
        c = b.node("Mul", [t, "cos_u"], f"{p}_{name}_c")
        sn = b.node("Mul", [rot, "sin_u"], f"{p}_{name}_s")
        out[name] = b.node("Add", [c, sn], f"{p}_{name}_emb")
    for name in "kv":  # repeat_kv
        u = b.node("Unsqueeze", [out[name], "axis_2"], f"{p}_{name}_u")
        e = b.node("Expand", [u, "repeat"], f"{p}_{name}_e")
        out[name] = b.node("Reshape", [e, "kv_merge"], f"{p}_{name}_rep")
    return out


def _attention(b: _Builder, p: str, x: str) -> str:
    heads = _heads(b, p, x)
    kt = b.node("Transpose", [heads["k"]], f"{p}_kT", perm=[0, 1, 3, 2])
    qk = b.node("MatMul", [heads["q"], kt], f"{p}_qk")
    scaled = b.node("Mul", [qk, "scale"], f"{p}_scaled")
    biased = b.node("Add", [scaled, "bias"], f"{p}_biased")
    probs = b.node("Softmax", [biased], f"{p}_probs", axis=-1)
    context = b.node("MatMul", [probs, heads["v"]], f"{p}_context")
    ct = b.node("Transpose", [context], f"{p}_ct", perm=[0, 2, 1, 3])
    merged = b.node("Reshape", [ct, "merge"], f"{p}_merged")
    hidden = b.shape.hidden
    return b.project(f"{p}.o_proj", merged, hidden, hidden, f"{p}_o")


def _mlp(b: _Builder, p: str, x: str) -> str:
    s = b.shape
    gate = b.project(f"{p}.gate_proj", x, s.hidden, s.intermediate, f"{p}_g")
    sig = b.node("Sigmoid", [gate], f"{p}_sig")
    silu = b.node("Mul", [gate, sig], f"{p}_silu")
    up = b.project(f"{p}.up_proj", x, s.hidden, s.intermediate, f"{p}_up")
    prod = b.node("Mul", [silu, up], f"{p}_prod")
    return b.project(f"{p}.down_proj", prod, s.intermediate, s.hidden, f"{p}_down")


def _layer(b: _Builder, i: int, h: str) -> str:
    p = f"layers.{i}"
    attn = _attention(b, f"{p}.self_attn", b.rms(f"{p}.input_layernorm", h))
    h = b.node("Add", [h, attn], f"{p}_attn_residual")
    mlp = _mlp(b, f"{p}.mlp", b.rms(f"{p}.post_attention_layernorm", h))
    return b.node("Add", [h, mlp], f"{p}_mlp_residual")


def _graph(b: _Builder) -> onnx.GraphProto:
    s = b.shape
    _constants(b)
    embed = b.weight("embed_tokens.weight", s.vocab, s.hidden)  # a float table even in int4
    h = b.node("Gather", [embed, "input_ids"], "embedded", axis=0)
    _shared(b)
    for i in range(s.layers):
        h = _layer(b, i, h)
    normed = b.rms("norm", h)
    b.project("lm_head.weight", normed, s.hidden, s.vocab, "logits")
    ids = [oh.make_tensor_value_info(n, _I64, ["batch", "seq"])
           for n in ("input_ids", "attention_mask", "position_ids")]  # fmt: skip
    logits = oh.make_tensor_value_info("logits", b.elem, ["batch", "seq", s.vocab])
    return oh.make_graph(b.nodes, "big_decoder", ids, [logits], initializer=b.inits)


def make_decoder(
    folder: str | Path, shape: DecoderShape, *, seed: int = 0, weights: Weights = FP32
) -> dict[str, Any]:
    """Write ``folder/decoder.onnx`` and its ``decoder.onnx.data``, weights stored as
    ``weights``; what was written: the model's path, its shape, the weights, node count
    and bytes on disk (file and data)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILE
    data = _DataFile(folder / (MODEL_FILE + ".data"))
    try:
        builder = _Builder(shape, data, seed, weights)
        graph = _graph(builder)
    finally:
        data.close()
    opsets = [oh.make_opsetid("", OPSET)]
    if weights.kind == "int4":
        opsets.append(oh.make_opsetid("com.microsoft", 1))
    model = oh.make_model(graph, opset_imports=opsets, ir_version=8)
    model.producer_name = "autofusion bench/_big_models.py"
    onnx.save_model(model, path)  # the weights are in the data file already
    data_bytes = (folder / (MODEL_FILE + ".data")).stat().st_size
    return {
        "path": str(path),
        "shape": asdict(shape),
        "weights": asdict(weights),
        "nodes": len(graph.node),
        "model_bytes": path.stat().st_size + data_bytes,
        "data_bytes": data_bytes,
    }
