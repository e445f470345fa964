"""What autofusion must make of each LLM corpus model: meta.json's ``expected`` and
``expected_ops`` for ``export_llm.py``'s exports.

Why: issue 17 asks, per family and exporter, for the expected count of each fused op.
The counts come from the architecture, not from what autofusion does today: every
decoder has ``2 * layers + 1`` RMSNorms (two per layer and the final one), of which all
but the first (the embedding's) follow a residual Add, so on onnxruntime they become
one ``SimplifiedLayerNormalization`` and ``2 * layers``
``SkipSimplifiedLayerNormalization``; one attention per layer and a rotary embedding on
its queries and keys. ``expected_ops`` (``meta.py``) counts op types in the optimized
graph: a plain key must match exactly, a ``?`` key is not required yet (at most that
many): every decoder's rotary embeddings and attention fuse (``rotary``,
``group_query_attention``), dynamo's cache graphs too (their finite mask's rows with
nothing to attend to take the cache's mean value).

Issue 24's families say what differs in their ``Arch`` (``_llm_families.py``), and the
counts follow (``Blocks``): Gemma-2's four RMSNorms per layer (two on the branches'
outputs, not after an Add), Qwen3's per-head q/k RMSNorms (``2 * layers`` more
SimplifiedLayerNormalization), Falcon's one and GPT-NeoX's two LayerNorms per layer
after one residual Add (``LayerNormalization|SkipLayerNormalization``), no rotary
embedding in SmolLM3's NoPE layer, and a ``MoE`` op per mixture-of-experts block
(Qwen3-MoE). What autofusion does not fuse on them yet is in
``tests/corpus/known_failures.py``. Rewritten into each model's meta.json by every build
(``export_llm.refresh``), so a change here needs no new export.

``expected`` (pattern -> minimum count) keeps the corpus's pattern-level checks: the
RMSNorms, the residual Add + RMSNorm pairs (``skip_rms_norm*``) and the Q/K/V merge where
q, k and v are separate Linears (not Phi-3); the default cpu profile prices the last two
as losses (onnxruntime's CPU SkipSimplifiedLayerNormalization is up to 2x slower than the
pair from 16 rows on, ``fusion_core/target_profiles/cpu.yaml``), so their keys also count
the places left out with that reason (``_torch_expect.any_of``), and
SkipSimplifiedLayerNormalization is a ``?`` op: the norms' total is exact.
The generic target at opset 17/18 has no RMSNormalization, Attention or RotaryEmbedding.
"""

from __future__ import annotations

from typing import NamedTuple

import _llm_families as fam
import onnx
from _torch_expect import any_of

FAMILIES = fam.FAMILIES
config_text = fam.config_text

NORMS = "SimplifiedLayerNormalization|SkipSimplifiedLayerNormalization"
_NORM_OPS = {  # Arch.norm -> (the norm's ops, plain or with the residual Add; the skip op)
    "rms": (NORMS, "SkipSimplifiedLayerNormalization"),
    "layer": ("LayerNormalization|SkipLayerNormalization", "SkipLayerNormalization"),
}
ATTENTION = "GroupQueryAttention|MultiHeadAttention"
MOE = "MoE"


class Blocks(NamedTuple):
    """What one export of a family has, from its architecture (``fam.Arch``)."""

    norms: int  # every norm, the per-head q/k ones included
    skips: int  # norms fed by a residual Add
    qk_norms: int
    rotary: int  # RotaryEmbedding ops: one on the queries, one on the keys per layer
    attentions: int
    moe: int

    @classmethod
    def of(cls, family: str, layers: int) -> Blocks:
        arch = FAMILIES[family].arch
        qk = 2 * layers if arch.qk_norm else 0
        rope = layers if arch.rope_layers is None else arch.rope_layers
        return cls(
            norms=arch.norms * layers + 1 + qk,
            skips=arch.residual_adds * layers,
            qk_norms=qk,
            rotary=2 * rope,
            attentions=layers,
            moe=layers if arch.moe else 0,
        )


def expected(family: str, kind: str, graph: onnx.ModelProto) -> tuple[dict, dict, str]:
    """(expected, expected_ops, notes) of one export."""
    spec = FAMILIES[family]
    blocks = Blocks.of(family, _layers(graph))
    both: dict[str, int] = {}
    if spec.separate_qkv:
        both[any_of("qkv")] = blocks.attentions
    norm_ops, skip_op = _NORM_OPS[spec.arch.norm]
    ort = dict(both)
    if spec.arch.norm == "rms":
        ort |= {any_of("rms_norm"): blocks.norms, any_of("skip_rms_norm"): blocks.skips}
    else:
        ort[any_of("skip_layer_norm")] = blocks.skips
    ops = {norm_ops: blocks.norms, "?" + skip_op: blocks.skips}
    ops |= {"RotaryEmbedding": blocks.rotary, ATTENTION: blocks.attentions}
    if spec.extra.get("attn_logit_softcapping") and not kind.endswith("_kv"):
        # the default profile prices soft-capped GroupQueryAttention as a loss on the CPU
        # at prefill (attention+softcap, fusion_core/target_profiles/cpu.yaml): a prefill
        # graph's Gemma-2 attention is not required; a KV-cache graph's fuses
        # (attention+softcap+cache: its decode steps gain)
        ops["?" + ATTENTION] = ops.pop(ATTENTION)
    if blocks.moe:
        ops[MOE] = blocks.moe
    return (
        {"generic": dict(both), "onnxruntime": ort},
        {"onnxruntime": ops},
        _notes(family, kind, blocks),
    )


def _notes(family: str, kind: str, blocks: Blocks) -> str:
    spec = FAMILIES[family]
    graph_kind = "decode graph with a KV cache" if kind.endswith("_kv") else "prefill graph"
    norm = "RMSNorms" if spec.arch.norm == "rms" else "LayerNorms"
    parts = [
        f"LLM decoder ({spec.notes}), {graph_kind}, {blocks.attentions} layers: "
        f"{blocks.norms} {norm} ({blocks.skips} after a residual Add"
        + (f", {blocks.qk_norms} on query/key heads" if blocks.qk_norms else "")
        + f"), {blocks.attentions} attentions"
    ]
    if blocks.rotary != 2 * blocks.attentions:
        parts.append(f"{blocks.rotary} rotary embeddings (none in a NoPE layer)")
    if blocks.moe:
        parts.append(f"{blocks.moe} mixture-of-experts blocks")
    if not spec.separate_qkv:
        parts.append("q, k and v are one Linear already")
    return "; ".join(parts) + "."


def _layers(graph: onnx.ModelProto) -> int:
    """Layers of the export: half its past inputs with a cache, else the families' count."""
    pasts = [i.name for i in graph.graph.input if i.name.startswith("past_key_values.")]
    return len(pasts) // 2 if pasts else fam.LAYERS
