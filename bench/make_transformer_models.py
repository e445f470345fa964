"""Generate tiny Hugging Face transformer ONNX models from both torch exporters.

Why this script exists: the fusion passes must recognise the subgraphs that
real transformer exports contain (LayerNorm, GELU, attention with its mask
arithmetic, the Reshape/Transpose around multi-head attention) in every form
users actually produce. Those forms depend on the model family (BERT, RoBERTa,
DistilBERT, GPT-2, ViT), on transformers' attention implementation ("eager"
writes out MatMul -> Softmax -> MatMul, "sdpa" calls
torch.nn.functional.scaled_dot_product_attention) and on the exporter
(TorchScript ``dynamo=False`` or dynamo ``dynamo=True``), so this script makes
all 5 x 2 x 2 combinations, plus BERT and GPT-2 (eager attention) from the dynamo
exporter with its optimizer off (``optimize=False``, the default before torch 2.7):
that graph keeps ``key.transpose(1, 2).transpose(-1, -2)`` as two Transposes.

Every model is built from a config object with seeded random weights (nothing
is downloaded): 2 layers, hidden 64, 4 heads, intermediate 128. The config's
initializer_range is raised to 0.1 and every bias and LayerNorm weight is
randomized (transformers initializes them to 0 and 1) so that a broken fusion
cannot hide behind identity parameters, as trained weights would not let it.

Both exporters run with their defaults except for the opset (TorchScript 17,
with constant folding; dynamo 18, with the onnxscript optimizer), dynamic batch and
sequence axes, inputs ``input_ids`` + ``attention_mask`` (text) or
``pixel_values`` (ViT), one output ``last_hidden_state``. Two departures: the
model is called through a keyword wrapper (see TextLastHiddenState), and the
dynamo files are saved without per-node stack traces (see export_dynamo).
Each file is checked with onnx.checker and against torch in onnxruntime (all
graph optimizations disabled) on several batch/sequence sizes, including
padding at the end of the attention mask, and described in ``manifest.json``
(inputs, opset, op-type counts overall and per layer).

torch and transformers are an optional extra of this project, only needed to
*regenerate* the models (written against torch 2.13.0, transformers 5.24.0).
Usage:

    python bench/make_transformer_models.py              # -> tests/data/transformers/
    python bench/make_transformer_models.py --out DIR [--only bert gpt2] [--keep-stack-traces]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort
import onnxscript

try:
    import torch
    import transformers
    from torch import nn
except ImportError:  # torch and transformers are an optional extra
    sys.exit(
        "make_transformer_models.py needs torch and transformers: "
        "pip install -e '.[torch]' (torch==2.13.0)"
    )

logger = logging.getLogger(__name__)

SEED = 0
TORCHSCRIPT_OPSET = 17
DYNAMO_OPSET = 18  # the dynamo exporter has no implementations below 18
ATOL = 1e-4
LAYERS, HIDDEN, HEADS, INTERMEDIATE = 2, 64, 4, 128
# A small vocabulary keeps the embedding table (vocab x hidden fp32) at 32 KB;
# the two layers' weights (~270 KB) then dominate the file size.
VOCAB_SIZE = 128
MAX_POSITIONS = 64
IMAGE_SIZE, PATCH_SIZE = 32, 8
INITIALIZER_RANGE = 0.1
EXPORT_BATCH, EXPORT_SEQUENCE = 2, 16
# (batch, sequence) the exported graph is checked at; the first is the shape
# it was exported with, the others exercise the dynamic axes.
CHECK_SHAPES = [(EXPORT_BATCH, EXPORT_SEQUENCE), (1, 9), (3, 11)]
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "transformers"
# ~320 KB of weights; the dynamo files add ~100-150 KB of per-node metadata
# (module paths, FX nodes) even without the stack traces (see export_dynamo).
MAX_BYTES = 640 << 10
MAX_TOTAL_BYTES = 10 << 20
ATTENTIONS = ("eager", "sdpa")
# (family, attention, exporter) made beside the full grid: the unoptimized dynamo
# graph differs from the optimized one in the attention core only (two Transposes
# for K^T), so two families show it.
EXTRA_VARIANTS = (("bert", "eager", "dynamo_noopt"), ("gpt2", "eager", "dynamo_noopt"))
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
_LAYER_SCOPE = re.compile(r"(?:^|[/.'])(?:layers?|h)\.(\d+)(?:[/.']|$)")


class Family(NamedTuple):
    config: type
    model: type
    config_kwargs: dict
    model_kwargs: dict


_BERT_SIZES = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=INTERMEDIATE,
    max_position_embeddings=MAX_POSITIONS,
)
_NO_POOLER = {"add_pooling_layer": False}
FAMILIES = {
    "bert": Family(transformers.BertConfig, transformers.BertModel, _BERT_SIZES, _NO_POOLER),
    "roberta": Family(
        transformers.RobertaConfig,
        transformers.RobertaModel,
        # RoBERTa numbers positions from pad_token_id + 1 (roberta-base: 512 + 2)
        {**_BERT_SIZES, "max_position_embeddings": MAX_POSITIONS + 2},
        _NO_POOLER,
    ),
    "distilbert": Family(
        transformers.DistilBertConfig,
        transformers.DistilBertModel,
        dict(
            vocab_size=VOCAB_SIZE,
            dim=HIDDEN,
            n_layers=LAYERS,
            n_heads=HEADS,
            hidden_dim=INTERMEDIATE,
            max_position_embeddings=MAX_POSITIONS,
        ),
        {},
    ),
    "gpt2": Family(
        transformers.GPT2Config,
        transformers.GPT2Model,
        dict(
            vocab_size=VOCAB_SIZE,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=INTERMEDIATE,
            n_positions=MAX_POSITIONS,
            bos_token_id=VOCAB_SIZE - 1,
            eos_token_id=VOCAB_SIZE - 1,
            # otherwise the model also returns a DynamicCache, which neither
            # exporter can flatten into graph outputs
            use_cache=False,
        ),
        {},
    ),
    "vit": Family(
        transformers.ViTConfig,
        transformers.ViTModel,
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE,
            image_size=IMAGE_SIZE,
            patch_size=PATCH_SIZE,
        ),
        _NO_POOLER,
    ),
}


class TextLastHiddenState(nn.Module):
    """Calls a text model by keyword and returns only last_hidden_state.

    transformers 5 cannot be traced positionally: the TorchScript exporter
    fills every forward() parameter by position, and transformers' config
    defaults decorator then also passes use_cache by keyword ("got multiple
    values for argument 'use_cache'"). The same wrapper is used for the
    dynamo exporter so both files have the same inputs and one output.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
        return out[0]


class ImageLastHiddenState(nn.Module):
    """Calls a vision model by keyword and returns only last_hidden_state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=False)[0]


def build_model(family: str, attn: str) -> nn.Module:
    """Seeded model with non-trivial biases and norm weights, wrapped, in inference mode."""
    spec = FAMILIES[family]
    config = spec.config(
        **spec.config_kwargs, initializer_range=INITIALIZER_RANGE, attn_implementation=attn
    )
    torch.manual_seed(SEED)
    model = spec.model(config, **spec.model_kwargs)
    if model.config._attn_implementation != attn:
        raise RuntimeError(
            f"{family}: asked for attn_implementation={attn!r}, "
            f"transformers chose {model.config._attn_implementation!r}"
        )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 and name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif param.dim() == 1:  # LayerNorm scales
                param.uniform_(0.5, 1.5)
    wrapper = ImageLastHiddenState if family == "vit" else TextLastHiddenState
    return wrapper(model).train(False)


def make_inputs(model: nn.Module, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Valid inputs: token ids in the vocabulary, row i padded by 2 * i tokens at the end."""
    gen = torch.Generator().manual_seed(SEED + batch * 1000 + sequence)
    if isinstance(model, ImageLastHiddenState):
        shape = (batch, 3, IMAGE_SIZE, IMAGE_SIZE)
        return {"pixel_values": torch.randn(shape, generator=gen)}
    pad = model.model.config.pad_token_id or 0
    ids = torch.randint(3, VOCAB_SIZE, (batch, sequence), generator=gen)
    mask = torch.ones(batch, sequence, dtype=torch.int64)
    for row in range(1, batch):
        n_pad = min(row * 2, sequence - 1)
        mask[row, sequence - n_pad :] = 0
        ids[row, sequence - n_pad :] = pad
    return {"input_ids": ids, "attention_mask": mask}


def _dynamic_axes(names: list[str]) -> dict[str, dict[int, str]]:
    if names == ["pixel_values"]:
        return {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}}
    axes = {0: "batch", 1: "sequence"}
    return {name: axes for name in [*names, "last_hidden_state"]}


def export_torchscript(model: nn.Module, inputs: dict, path: Path, dynamic: bool) -> None:
    # The exporter's defaults otherwise (constant folding on, eval mode).
    names = list(inputs)
    torch.onnx.export(
        model,
        tuple(inputs.values()),
        str(path),
        dynamo=False,
        opset_version=TORCHSCRIPT_OPSET,
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes=_dynamic_axes(names) if dynamic else None,
    )


def export_dynamo(
    model: nn.Module,
    inputs: dict,
    path: Path,
    dynamic: bool,
    *,
    keep_stack_traces: bool = False,
    optimize: bool = True,
) -> None:
    # The exporter's defaults, including optimize=True (onnxscript's optimizer
    # folds each Linear's weight Transpose into a new initializer, turns
    # Linear into MatMul + Add or Gemm, and drops Constant/Identity nodes):
    # that graph is what users get. external_data=False: one self-contained
    # file (the default writes the weights to a side "<name>.data" file).
    dynamic_shapes = None
    if dynamic:
        dims = {0: torch.export.Dim("batch")}
        if "pixel_values" not in inputs:
            # the position embedding table bounds the sequence length
            dims[1] = torch.export.Dim("sequence", max=MAX_POSITIONS)
        dynamic_shapes = {name: dims for name in inputs}
    program = torch.onnx.export(
        model,
        tuple(inputs.values()),
        dynamo=True,
        opset_version=DYNAMO_OPSET,
        input_names=list(inputs),
        output_names=["last_hidden_state"],
        dynamic_shapes=dynamic_shapes,
        optimize=optimize,
    )
    if not keep_stack_traces:
        # Only metadata, never the graph: each node's Python stack trace holds
        # absolute paths of this machine's checkout and site-packages (so the
        # bytes change per checkout) and is ~40% of the metadata; without them
        # the 22 files fit in 10 MiB. namespace, name_scopes, class_hierarchy
        # and fx_node stay.
        for node in program.model.graph.all_nodes():
            node.metadata_props.pop(STACK_TRACE_KEY, None)
    program.save(str(path), external_data=False)


EXPORTERS = {
    "torchscript": export_torchscript,
    "dynamo": export_dynamo,
    "dynamo_noopt": functools.partial(export_dynamo, optimize=False),
}
GRID_EXPORTERS = ("torchscript", "dynamo")


def check_with_onnxruntime(path: Path, model: nn.Module, shapes: list) -> float:
    """Compare the raw graph (no ORT optimizations) with torch at each (batch, sequence)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    max_err = 0.0
    for batch, sequence in shapes:
        inputs = make_inputs(model, batch, sequence)
        with torch.no_grad():
            expected = model(**inputs).numpy()
        (got,) = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
        if got.shape != expected.shape:
            raise RuntimeError(
                f"{path.name} at (batch, sequence)=({batch}, {sequence}): onnxruntime "
                f"output shape {got.shape}, torch {expected.shape}"
            )
        err = float(np.abs(got - expected).max())
        if not err <= ATOL:  # also catches NaN
            raise RuntimeError(
                f"{path.name} at (batch, sequence)=({batch}, {sequence}): onnxruntime "
                f"differs from torch (max abs err {err:.3g} > atol {ATOL})"
            )
        max_err = max(max_err, err)
    return max_err


def _op_type(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _layer_of(node: onnx.NodeProto) -> str:
    """Transformer layer index from the node's module scope, or "none".

    TorchScript puts the module path in the node name
    (``/model/encoder/layer.0/attention/...``); dynamo in the
    ``pkg.torch.onnx.name_scopes`` metadata. Nodes the dynamo optimizer
    created have no metadata and count as "none".
    """
    scopes = {p.key: p.value for p in node.metadata_props}.get("pkg.torch.onnx.name_scopes")
    match = _LAYER_SCOPE.search(scopes or node.name)
    return match.group(1) if match else "none"


def _value_info(value: onnx.ValueInfoProto) -> dict:
    tensor = value.type.tensor_type
    dims = tensor.shape.dim
    return {
        "name": value.name,
        "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
        "shape": [d.dim_param if d.HasField("dim_param") else d.dim_value for d in dims],
    }


def describe(path: Path, family: str, attn: str, exporter: str) -> dict:
    """The manifest entry: what tests can expect to find in the file."""
    model = onnx.load(str(path))
    by_layer: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for node in model.graph.node:
        by_layer[_layer_of(node)][_op_type(node)] += 1
    counts = collections.Counter(_op_type(n) for n in model.graph.node)
    return {
        "file": path.name,
        "family": family,
        "attention": attn,
        "exporter": exporter,
        "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "ir_version": model.ir_version,
        "inputs": [_value_info(v) for v in model.graph.input],
        "outputs": [_value_info(v) for v in model.graph.output],
        "vocab_size": None if family == "vit" else VOCAB_SIZE,
        "num_layers": LAYERS,
        "num_heads": HEADS,
        "hidden": HIDDEN,
        "intermediate": INTERMEDIATE,
        "file_size": path.stat().st_size,
        "num_nodes": len(model.graph.node),
        "num_initializers": len(model.graph.initializer),
        "op_counts": dict(sorted(counts.items())),
        "op_counts_by_layer": {k: dict(sorted(v.items())) for k, v in sorted(by_layer.items())},
    }


def export_and_check(model: nn.Module, export: Callable, path: Path) -> dict:
    """Export with dynamic axes, falling back to static shapes, and check the file."""
    inputs = make_inputs(model, EXPORT_BATCH, EXPORT_SEQUENCE)
    try:
        export(model, inputs, path, dynamic=True)
        max_err = check_with_onnxruntime(path, model, CHECK_SHAPES)
        return {"dynamic": True, "max_abs_err": max_err}
    except Exception as err:  # any failure of the dynamic export: try static
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
        logger.warning("%s: dynamic export failed (%s); exporting static shapes", path.name, reason)
    export(model, inputs, path, dynamic=False)
    max_err = check_with_onnxruntime(path, model, CHECK_SHAPES[:1])
    return {"dynamic": False, "static_because": reason, "max_abs_err": max_err}


def generate_one(
    path: Path, family: str, attn: str, exporter: str, keep_stack_traces: bool
) -> dict:
    model = build_model(family, attn)
    export = EXPORTERS[exporter]
    if exporter.startswith("dynamo"):
        export = functools.partial(export, keep_stack_traces=keep_stack_traces)
    start = time.perf_counter()
    checked = export_and_check(model, export, path)
    if (path.parent / (path.name + ".data")).exists():
        raise RuntimeError(f"{path.name}: unexpected external data file")
    if path.stat().st_size > MAX_BYTES:
        raise RuntimeError(f"{path.name}: {path.stat().st_size} bytes > {MAX_BYTES}")
    onnx.checker.check_model(str(path), full_check=True)
    entry = describe(path, family, attn, exporter) | checked
    elapsed = time.perf_counter() - start
    logger.info(
        "%s: %.1f KiB, %d nodes, dynamic=%s, max abs err %.2g, %.1fs",
        path.name,
        entry["file_size"] / 1024,
        entry["num_nodes"],
        entry["dynamic"],
        entry["max_abs_err"],
        elapsed,
    )
    return entry


def generate(out_dir: Path, families: list[str], *, keep_stack_traces: bool = False) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    models, skipped = [], []
    combos = [(f, a, e) for f in families for a in ATTENTIONS for e in GRID_EXPORTERS]
    combos += [c for c in EXTRA_VARIANTS if c[0] in families]
    for family, attn, exporter in combos:
        path = out_dir / f"{family}_{attn}_{exporter}.onnx"
        try:
            models.append(generate_one(path, family, attn, exporter, keep_stack_traces))
        except Exception as err:  # record it and go on with the others
            path.unlink(missing_ok=True)  # no stale or half-checked file
            reason = f"{type(err).__name__}: {str(err).strip()[:500]}"
            logger.error("skipping %s/%s/%s: %s", family, attn, exporter, reason)
            skipped.append(
                {"family": family, "attention": attn, "exporter": exporter, "why": reason}
            )
    total = sum(m["file_size"] for m in models)
    if total > MAX_TOTAL_BYTES and not keep_stack_traces:
        raise RuntimeError(f"{out_dir}: {total} bytes of models > {MAX_TOTAL_BYTES}")
    manifest = {
        "generator": "bench/make_transformer_models.py",
        "versions": {
            m.__name__: m.__version__ for m in (torch, transformers, onnx, onnxscript, ort)
        },
        "atol": ATOL,
        "checked_shapes": CHECK_SHAPES,
        "dynamo_stack_traces_kept": keep_stack_traces,
        "models": models,
        "skipped": skipped,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def summary_table(manifest: dict) -> str:
    """Markdown table of the op types that matter for fusion (for tests/data/README.md)."""
    cols = ["LayerNormalization", "ReduceMean", "Erf", "Tanh", "Softmax", "MatMul", "Gemm"]
    head = ["file", "KiB", "nodes", *cols, "Reshape/layer", "Transpose/layer"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for m in manifest["models"]:
        layer0 = m["op_counts_by_layer"].get("0", {})
        row = [f"`{m['file']}`", f"{m['file_size'] / 1024:.0f}", str(m["num_nodes"])]
        row += [str(m["op_counts"].get(c, 0)) for c in cols]
        row += [str(layer0.get("Reshape", 0)), str(layer0.get("Transpose", 0))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output directory ({OUT})")
    parser.add_argument("--only", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument(
        "--keep-stack-traces",
        action="store_true",
        help=f"keep the dynamo exporter's per-node {STACK_TRACE_KEY} metadata "
        "(machine-specific paths; the files no longer fit the 10 MiB budget)",
    )
    args = parser.parse_args(argv)
    if args.only != list(FAMILIES) and args.out.resolve() == OUT:
        parser.error("--only would leave a partial manifest.json in the test data: add --out")
    # onnxscript's optimizer logs every rewrite at INFO; show only ours
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logger.setLevel(logging.INFO)
    manifest = generate(args.out, args.only, keep_stack_traces=args.keep_stack_traces)
    sys.stdout.write(summary_table(manifest))
    for item in manifest["skipped"]:
        sys.stdout.write(f"skipped {item['family']}/{item['attention']}/{item['exporter']}\n")


if __name__ == "__main__":
    main()
