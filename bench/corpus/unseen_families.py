"""Decoder families outside the corpus: what fuses, as a new user would find it.

Why: issue 24's acceptance is measured on families and exporters the corpus does not
name, since a rule written for the corpus's spellings proves little about the next
family. This builds each family below from a transformers config (``_llm_families``:
2 layers, hidden 256, 8 query and 2 key/value heads of 32, seeded weights with every
1-D parameter re-randomized), exports the prefill graph with both torch exporters
(``_llm_torch``: TorchScript at opset 17, dynamo), optimizes it for onnxruntime with the
check on (``fusion_core.optimize``, profile ``cpu-roofline`` so that every match shows),
and prints per model the fused attention ops, the Softmax ops before and after (a
mixture of experts' routers keep theirs unless the block becomes a MoE), the fused rotary
and norm ops, the MoE ops out of the model's blocks of experts (``moe_blocks``: counted
in the torch model, since a router's ops in the graph say nothing of how many blocks
there are: a sparsemixer has no TopK, a group-limited router one per group), whether the
check passed, and the first attention or rotary near miss where an attention's Softmax
is left (else the first router's, where a block of experts is left).
None of these families is in ``export_llm.py``'s corpus, and no rule names them.

    python bench/corpus/unseen_families.py [--out DIR] [--markdown FILE] [--kv] [FAMILY ...]

``--kv`` exports the one-step KV-cache graph instead (``_llm_torch``'s ``dynamo_kv``:
torch.export of the model with the cache it builds for itself, past and present as
inputs and outputs: each layer's key and value (and a sparse attention's indexer keys),
or its convolution and recurrent states (``_kv_states``); one new token where
torch.export cannot keep the length free; the dynamo exports from an example of two
rows, ``EXAMPLE_BATCH``, so the batch stays a dim), where the attention should become
GroupQueryAttention with the cache.

Needs the corpus extra (torch, transformers): ``make .venv/.corpus-installed``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path

import _llm_families as fam
from _unseen_fifth import FIFTH
from _unseen_fourth import FOURTH
from _unseen_more import MORE
from _unseen_third import THIRD

HEAD_DIM = fam.HEAD_DIM
_BIGCODE_SIZES = dict(
    vocab_size=256, initializer_range=0.05, pad_token_id=0, bos_token_id=1, eos_token_id=2
)
_BIGCODE = {"n_embd": 256, "n_layer": 2, "n_head": 8, "multi_query": True, "n_positions": 128}
_GRANITE = {
    "attention_multiplier": 0.1,
    "residual_multiplier": 0.5,
    "embedding_multiplier": 2.0,
    "logits_scaling": 4.0,
}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2}
_GEMMA3 = {"head_dim": HEAD_DIM, "sliding_window": 8, "query_pre_attn_scalar": HEAD_DIM}
_IDS = dict(vocab_size=256, initializer_range=0.05, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_NEO = dict(
    _IDS,
    hidden_size=256,
    num_layers=2,
    num_heads=8,
    max_position_embeddings=128,
    attention_types=[[["global", "local"], 1]],
    window_size=8,
)
_OPT = dict(
    _IDS,
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    ffn_dim=512,
    max_position_embeddings=128,
    word_embed_proj_dim=256,
)
_XGLM = dict(
    _IDS, d_model=256, num_layers=2, attention_heads=8, ffn_dim=512, max_position_embeddings=128
)
_BIOGPT = dict(
    _IDS,
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    intermediate_size=512,
    max_position_embeddings=128,
)
_BLOOM = dict(_IDS, hidden_size=256, n_layer=2, n_head=8)
_CODEGEN = dict(_IDS, n_embd=256, n_layer=2, n_head=8, n_positions=128, n_ctx=128, rotary_dim=16)
_F = fam.Family
UNSEEN = {  # family -> (Family, what sets it apart)
    "olmo2": (
        _F("Olmo2Config", "Olmo2ForCausalLM", {}),
        "q/k RMSNorm on the whole projection, post-norms",
    ),
    "olmo": (
        _F("OlmoConfig", "OlmoForCausalLM", {"clip_qkv": 8.0}),
        "non-parametric LayerNorm, q/k/v clipped",
    ),
    "stablelm": (
        _F("StableLmConfig", "StableLmForCausalLM", {"partial_rotary_factor": 0.25}),
        "partial rotary 0.25, LayerNorm with bias",
    ),
    "stablelm_qk_norm": (
        _F(
            "StableLmConfig",
            "StableLmForCausalLM",
            {"partial_rotary_factor": 0.25, "qk_layernorm": True},
        ),
        "as stablelm, and a LayerNorm of its own for each head of q and k",
    ),
    "phi": (
        _F("PhiConfig", "PhiForCausalLM", {"partial_rotary_factor": 0.5}),
        "partial rotary 0.5, parallel attention and MLP, biases",
    ),
    "cohere": (
        _F("CohereConfig", "CohereForCausalLM", {"use_qk_norm": False}),
        "interleaved rotary on the transposed heads, parallel block",
    ),
    "starcoder2": (
        _F("Starcoder2Config", "Starcoder2ForCausalLM", {"sliding_window": 8}),
        "LayerNorm with bias, sliding window, GELU MLP",
    ),
    "gpt_bigcode": (
        _F("GPTBigCodeConfig", "GPTBigCodeForCausalLM", _BIGCODE, base=_BIGCODE_SIZES),
        "multi-query, learned positions, no rotary",
    ),
    "granite": (
        _F("GraniteConfig", "GraniteForCausalLM", _GRANITE),
        "attention, residual, embedding and logit multipliers",
    ),
    "mixtral": (
        _F(
            "MixtralConfig",
            "MixtralForCausalLM",
            {"num_local_experts": 4, "num_experts_per_tok": 2},
            experts="batched_mm",
        ),
        "top-2 of 4 experts",
    ),
    "nemotron": (
        _F(
            "NemotronConfig",
            "NemotronForCausalLM",
            {"partial_rotary_factor": 0.5, "head_dim": HEAD_DIM},
        ),
        "partial rotary 0.5, LayerNorm1P, squared-ReLU MLP",
    ),
    "glm": (
        _F("GlmConfig", "GlmForCausalLM", {"head_dim": HEAD_DIM, "partial_rotary_factor": 0.5}),
        "interleaved partial rotary",
    ),
    "persimmon": (
        _F(
            "PersimmonConfig",
            "PersimmonForCausalLM",
            {"partial_rotary_factor": 0.5, "qk_layernorm": True},
            base=fam._OWN_SIZES,
        ),
        "q, k, v gathered from [B, S, N, 3, H], LayerNorm of q and k, partial rotary",
    ),
    "gemma3": (
        _F("Gemma3TextConfig", "Gemma3ForCausalLM", _GEMMA3),
        "q/k RMSNorm after the head Transpose, sliding window",
    ),
    "olmoe": (
        _F("OlmoeConfig", "OlmoeForCausalLM", _MOE, experts="batched_mm"),
        "top-2 of 4 experts, weights not renormalized, q/k RMSNorm",
    ),
    "qwen2_moe": (
        _F(
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            {**_MOE, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 256},
            experts="batched_mm",
        ),
        "top-2 of 4 experts beside a shared expert with a sigmoid gate",
    ),
    "granitemoe": (
        _F(
            "GraniteMoeConfig",
            "GraniteMoeForCausalLM",
            {"num_local_experts": 4, "num_experts_per_tok": 2, **_GRANITE},
            experts="batched_mm",
        ),
        "top-2 of 4 experts (top-k, then softmax), Granite's multipliers",
    ),
    "phimoe": (
        _F(
            "PhimoeConfig",
            "PhimoeForCausalLM",
            {"num_local_experts": 4, "num_experts_per_tok": 2},
            experts="batched_mm",
        ),
        "top-2 of 4 experts by sparsemixer (no plain softmax router)",
    ),
    # issue 24, stop 35: spellings of the mask, the scale and K^T rather than of the heads
    "gpt_neo": (
        _F("GPTNeoConfig", "GPTNeoForCausalLM", {}, base=_NEO, attn="eager"),
        "no scale at all, masked_fill of the scores, local attention every other layer",
    ),
    "opt": (
        _F("OPTConfig", "OPTForCausalLM", {}, base=_OPT),
        "the query projection scaled, learned positions, biases",
    ),
    "xglm": (
        _F("XGLMConfig", "XGLMForCausalLM", {}, base=_XGLM, attn="eager"),
        "the query projection scaled, sinusoidal positions",
    ),
    "biogpt": (
        _F("BioGptConfig", "BioGptForCausalLM", {}, base=_BIOGPT),
        "the query projection scaled, learned positions",
    ),
    "bloom": (
        _F("BloomConfig", "BloomForCausalLM", {}, base=_BLOOM, attn="eager"),
        "ALiBi, q, k and v from one [B, S, N, 3, H] projection, 3-D heads (baddbmm)",
    ),
    "codegen": (
        _F("CodeGenConfig", "CodeGenForCausalLM", {}, base=_CODEGEN),
        "q, k and v from one projection in 4 model-parallel blocks, partial interleaved rotary",
    ),
}
UNSEEN.update(MORE)  # the second survey's families (stop 41)
UNSEEN.update(THIRD)  # the third survey's, hybrids with attention layers among them
UNSEEN.update(FOURTH)  # the fourth survey's
UNSEEN.update(FIFTH)  # the fifth survey's
# The dynamo exports' example batch: from one row torch.export fixes the batch at 1 where
# a model copies into a slice of a buffer it made ("Invalid ranges [2:1]", _llm_torch)
EXAMPLE_BATCH = 2
KINDS = {
    "attention": ("GroupQueryAttention", "MultiHeadAttention", "Attention"),
    "rotary": ("RotaryEmbedding",),
    "norms": (
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
    ),
    "moe": ("MoE",),
}
EXPORTERS = ("torchscript", "dynamo")


def moe_blocks(family: str) -> int:
    """The model's blocks of experts: its outermost modules that hold experts or a
    router (a mixture-of-attention's heads count as one)."""
    model = fam.build(family)
    owners = [n for n, m in model.named_modules() if hasattr(m, "experts") or hasattr(m, "router")]
    return sum(1 for n in owners if not any(n.startswith(f"{o}.") for o in owners))


def check_cell(result) -> str:
    """The check's verdict as a table cell: passed (with the profiles it left out, since
    the original cannot run at them: a graph fixed to some lengths says so here), the
    failure, or the fallback's."""
    check = result.check
    if result.fallback:  # the fused model failed its check: it came back (partly) unfused
        return f"fell back: {result.fallback.get('failure')}"
    if check is None:
        return "none"
    if not check.passed:
        return check.failure or "failed"
    if check.skipped:
        return f"passed; left out, the original cannot run there: {'; '.join(check.skipped)}"[:160]
    return "passed"


def register_unseen() -> None:
    """Make the surveyed families known to the exporter (``_llm_families.FAMILIES``
    holds the corpus's; ``survey`` exports through it)."""
    fam.FAMILIES.update({name: spec for name, (spec, _) in UNSEEN.items()})


def survey(family: str, kind: str, folder: Path) -> dict:
    """One row: export (cached in ``folder``), optimize with the check, count."""
    import _llm_torch
    import onnx

    from autofusion.fusion_core import OptimizeConfig, optimize

    path = folder / f"{family}_{kind}.onnx"
    row = {"family": family, "exporter": kind}
    try:
        if not path.exists():
            _llm_torch.export(family, kind, path, batch=EXAMPLE_BATCH)
    except Exception as exc:  # an exporter's own failure: the row says which
        cause = exc.__cause__ or exc  # torch.export's own error, not the wrapper's advice
        text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(cause)).split())  # one table cell
        row["error"] = f"export failed: {type(cause).__name__}: {text[:120]}"
        return row
    model = onnx.load(str(path))
    started = time.perf_counter()
    result = optimize(model, OptimizeConfig(target="onnxruntime", target_profile="cpu-roofline"))
    row["seconds"] = time.perf_counter() - started
    after = Counter()
    for op, count in result.ops_after.items():
        after[op.split("::")[-1]] += count
    row["softmax"] = sum(1 for node in model.graph.node if node.op_type == "Softmax")
    row["blocks"] = moe_blocks(family)
    row["softmax_left"] = after["Softmax"]  # a mixture of experts' routers keep theirs
    for name, ops in KINDS.items():
        row[name] = sum(after[op] for op in ops)
    row["check"] = check_cell(result)
    misses = [m for m in result.near_misses if "attention" in m.pattern or "rotary" in m.pattern]
    experts = [m for m in result.near_misses if m.pattern.startswith("moe_")]
    # a block of experts that did not fuse keeps its router's Softmax (most have one)
    left = after["Softmax"] - (row["blocks"] - row["moe"])  # the attention's left
    if left > 0 and misses:
        row["miss"] = f"{misses[0].pattern}: {misses[0].reason}"
    elif row["moe"] < row["blocks"] and experts:
        row["miss"] = f"{experts[0].pattern}: {experts[0].reason}"
    else:
        row["miss"] = ""
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| family | what sets it apart | exporter | attention fused | Softmax before, left "
        "| rotary | norms | MoE of blocks | check | first near miss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        about = UNSEEN[row["family"]][1]
        if "error" in row:
            lines.append(
                f"| {row['family']} | {about} | {row['exporter']} | - | - | - | - | - "
                f"| {row['error']} | |"
            )
            continue
        miss = row["miss"].replace("|", "/")[:160]
        lines.append(
            f"| {row['family']} | {about} | {row['exporter']} "
            f"| {row['attention']} | {row['softmax']}, {row['softmax_left']} "
            f"| {row['rotary']} | {row['norms']} | {row['moe']} of {row['blocks']} "
            f"| {row['check']} | {miss} |"
        )
    return "\n".join(lines) + "\n"


def known_families(parser: argparse.ArgumentParser, asked: list[str], known) -> list[str]:
    """``asked`` (all of ``known`` when empty); a name ``known`` lacks is the parser's
    error, naming the choices. The survey scripts share it."""
    unknown = sorted(set(asked) - set(known))
    if unknown:
        parser.error(f"unknown families {unknown}: choose from {', '.join(known)}")
    return list(asked) or list(known)


def emit_table(table: str, path: Path | None) -> None:
    """The Markdown ``table`` printed, and written to ``path`` where one is given."""
    print(table)
    if path:
        path.write_text(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help=f"some of {', '.join(UNSEEN)} (all)")
    default = Path.home() / ".cache/autofusion-corpus/unseen"
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--kv", action="store_true", help="the KV-cache export (dynamo_kv)")
    args = parser.parse_args(argv)
    families = known_families(parser, args.families, UNSEEN)
    logging.basicConfig(level=logging.WARNING)
    register_unseen()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for family in families:
        for kind in ("dynamo_kv",) if args.kv else EXPORTERS:
            rows.append(survey(family, kind, args.out))
            print(rows[-1], flush=True)
    emit_table(markdown(rows), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
