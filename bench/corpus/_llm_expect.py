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
nothing to attend to take the cache's mean value). Rewritten
into each model's meta.json by every build (``export_llm.refresh``), so a change here
needs no new export.

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

import _llm_families as fam
import onnx
from _torch_expect import any_of

FAMILIES = fam.FAMILIES
config_text = fam.config_text

NORMS = "SimplifiedLayerNormalization|SkipSimplifiedLayerNormalization"


def expected(family: str, kind: str, graph: onnx.ModelProto) -> tuple[dict, dict, str]:
    """(expected, expected_ops, notes) of one export."""
    spec = FAMILIES[family]
    layers = _layers(graph)
    both: dict[str, int] = {}
    if spec.separate_qkv:
        both[any_of("qkv")] = layers
    ort = both | {any_of("rms_norm"): 2 * layers + 1, any_of("skip_rms_norm"): 2 * layers}
    attention = "GroupQueryAttention|MultiHeadAttention"
    ops = {
        NORMS: 2 * layers + 1,
        "?SkipSimplifiedLayerNormalization": 2 * layers,
        "RotaryEmbedding": 2 * layers,
        attention: layers,
    }
    graph_kind = "decode graph with a KV cache" if kind.endswith("_kv") else "prefill graph"
    notes = (
        f"LLM decoder ({spec.notes}), {graph_kind}, {layers} layers: {2 * layers + 1} "
        f"RMSNorms ({2 * layers} after a residual Add), {layers} attentions"
        + ("" if spec.separate_qkv else "; q, k and v are one Linear already")
        + "."
    )
    return {"generic": dict(both), "onnxruntime": ort}, {"onnxruntime": ops}, notes


def _layers(graph: onnx.ModelProto) -> int:
    """Layers of the export: half its past inputs with a cache, else the families' count."""
    pasts = [i.name for i in graph.graph.input if i.name.startswith("past_key_values.")]
    return len(pasts) // 2 if pasts else fam.LAYERS
