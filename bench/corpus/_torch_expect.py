"""What autofusion must fuse in each exported transformer: meta.json's ``expected``.

Why: issue 13 asks the corpus tier to assert "the fusions that matter" per family, and
says which: attention in every block of the encoder families; for the LLM decoders
(Llama, Qwen2, Phi-3) RMSNorm and the Q/K/V merge (their attention is a later issue)
and otherwise only no crash and no slowdown. Beside those, what already fuses in these
graphs and matters (residual Add + LayerNorm -> SkipLayerNormalization, GELU) is
required too, so that it cannot silently stop. SkipLayerNormalization and the Q/K/V
merge are what the default cpu profile prices as losses: their keys (``?...``) accept
a place fused or left out with the cost model's reason.

Counts come from the model itself, not from what autofusion finds today: one attention
per Softmax in the graph, one GELU per Erf, one skip norm per LayerNormalization fed by
a residual Add of two activations, one RMSNorm per RMSNorm module, one Q/K/V merge per
block where the family has separate q, k and v projections (Phi-3 and ModernBERT fuse
them into one Linear already). Pattern names are alternatives (``a|b``, see
``meta.py``) over every builtin pattern of the kind, read from
``fusion_core/patterns/builtin`` when the model is exported, since which spelling
matches is the exporter's business. Targets: the fused ops that need opset 23 on the
generic target (ONNX Attention, RMSNormalization) or a contrib op (SkipLayerNormalization,
Gelu below opset 20) are required on onnxruntime only.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import onnx
import yaml

BUILTIN = Path(__file__).resolve().parents[2] / "fusion_core" / "patterns" / "builtin"
KINDS = {  # kind -> its builtin patterns: names, or name prefixes ending in "*"
    "attention": ("attention",),
    "rms_norm": ("rms_norm*",),
    "skip_layer_norm": ("skip_layer_norm*",),
    "skip_rms_norm": ("skip_rms_norm*",),
    "gelu": ("gelu_*",),
    "qkv": ("qkv_merge*", "qkv_bias_merge*"),
    "rotary_interleaved": ("rotary_embedding_interleaved*",),
}


def _of_kind(name: str, kind: str) -> bool:
    return any(
        name.startswith(spec[:-1]) if spec.endswith("*") else name == spec for spec in KINDS[kind]
    )


@cache
def builtin_names() -> tuple[str, ...]:
    names = []
    for path in sorted(BUILTIN.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        names += [p["name"] for p in doc.get("patterns", [doc]) if "name" in p]
    return tuple(sorted(set(names)))


# Kinds found in every block but not always fused: the skip norms, which the default cpu
# profile prices as a loss (its kernel factors, docs/cost.md), and the Q/K/V merge, which
# attention's fusion over the same MatMuls takes in an encoder.
PRICED_AS_LOSS = ("skip_layer_norm", "skip_rms_norm", "qkv")


def any_of(kind: str) -> str:
    """The ``a|b|...`` key of every builtin pattern of ``kind`` (``?a|b|...`` for a
    kind the default profile may leave out as a predicted loss, ``meta.py``)."""
    names = [n for n in builtin_names() if _of_kind(n, kind)]
    if not names:
        raise RuntimeError(f"no builtin pattern of kind {kind!r} in {BUILTIN}")
    return ("?" if kind in PRICED_AS_LOSS else "") + "|".join(names)


def graph_counts(graph: onnx.GraphProto) -> dict[str, int]:
    """Structural counts of the exported graph: Softmax, Erf, residual LayerNorms."""
    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in graph.node for o in n.output}

    def residual(name: str) -> bool:
        node = producer.get(name)
        return node is not None and node.op_type == "Add" and not set(node.input) & constants

    ops = [n.op_type for n in graph.node]
    skips = sum(n.op_type == "LayerNormalization" and residual(n.input[0]) for n in graph.node)
    return {"softmax": ops.count("Softmax"), "erf": ops.count("Erf"), "skip": skips}


def rms_norms(model) -> int:
    """RMSNorm modules of a transformers model (T5 calls its own T5LayerNorm)."""
    return sum(type(m).__name__.endswith(("RMSNorm", "T5LayerNorm")) for m in model.modules())


def expected(spec, model, graph: onnx.ModelProto) -> tuple[dict, str]:
    """(expected per target, notes) for one export of a family."""
    counts = graph_counts(graph.graph)
    ort: dict[str, int] = {}
    both: dict[str, int] = {}
    if spec.separate_qkv:
        both[any_of("qkv")] = spec.blocks
    if rms := rms_norms(model):
        ort[any_of("rms_norm")] = rms
    if spec.interleaved_rotary:  # the query's and the key's, in every block
        ort[any_of("rotary_interleaved")] = 2 * spec.blocks
    if not spec.decoder:
        ort[any_of("attention")] = counts["softmax"]
        for kind, key in (("gelu", "erf"), ("skip_layer_norm", "skip")):
            if counts[key]:
                ort[any_of(kind)] = counts[key]
    return {"generic": dict(both), "onnxruntime": both | ort}, _notes(spec, counts, rms)


def _notes(spec, counts: dict[str, int], rms: int) -> str:
    what = "LLM decoder (prefill, no KV cache)" if spec.decoder else "encoder"
    parts = [f"{what}: {spec.blocks} blocks, {counts['softmax']} Softmax"]
    if spec.decoder:
        parts.append(
            "the decoder's attention is the LLM corpus's (export_llm.py): RMSNorm, the Q/K/V "
            "merge and GPT-J's interleaved rotary embeddings required here"
        )
    else:
        parts.append("attention must fuse in every block on onnxruntime")
    if not spec.separate_qkv:
        parts.append("q, k and v are one Linear already: no Q/K/V merge")
    parts.append(
        f"{rms} RMSNorm, {counts['erf']} GELU (Erf), {counts['skip']} residual LayerNorm; "
        "generic at opset 17/18 has no Attention/RMSNormalization/Gelu op, so it requires "
        "only the Q/K/V merge"
    )
    return "; ".join(parts) + "."
