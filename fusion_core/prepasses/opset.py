"""The opt-in opset upgrade (``OptimizeConfig.upgrade_opset``, ``--upgrade-opset N``).

Some fusions need an op that a newer opset defines: a written-out HardSwish becomes ONNX
``HardSwish`` only from opset 14, so the generic target leaves an opset-11 MobileNet
with ``x * HardSigmoid(x)``. Asked to, this pass converts the model's default-domain
opset to N with onnx's version converter
(https://onnx.ai/onnx/api/version_converter.html) before every other pre-pass, so the
patterns see the newer ops' spelling and may emit them. Other domains are left alone.

The converter works on a ``ModelProto``: the model is serialized (its weights read in),
converted and read back, so this returns a new ``ir.Model``. A model that already
imports opset N or later is left as it is (this pass never downgrades). A conversion
onnx cannot do (no adapter for some op, a graph its checker rejects, a model over
protobuf's 2 GB) is a ``ConfigError`` naming the reason, never a traceback.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx
import onnx.version_converter
import onnx_ir as ir

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.ir import PROTOBUF_LIMIT_BYTES

__all__ = ["OpsetUpgrade", "upgrade_opset"]

logger = logging.getLogger(__name__)

_ADVICE = "run without --upgrade-opset"


@dataclass(frozen=True)
class OpsetUpgrade:
    """What the pass did: ``before`` and ``after`` are default-domain opsets."""

    before: int
    after: int

    @property
    def changed(self) -> bool:
        return self.after != self.before

    def describe(self) -> str:
        """The entry in ``Result.prepasses`` (and so in the report)."""
        if self.changed:
            return f"upgrade_opset: {self.before} -> {self.after}"
        return f"upgrade_opset: the model imports opset {self.before}, left as it is"


def default_opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def upgrade_opset(model: ir.Model, target: int | None) -> tuple[ir.Model, OpsetUpgrade | None]:
    """``model`` converted to opset ``target`` (a new model), or ``model`` itself when
    ``target`` is None or not above the model's opset."""
    if target is None:
        return model, None
    before = default_opset(model)
    newest = onnx.defs.onnx_opset_version()
    if target > newest:
        raise ConfigError(
            f"cannot convert this model to opset {target}: onnx {onnx.__version__} knows "
            f"opsets up to {newest}; {_ADVICE}"
        )
    if target <= before:
        return model, OpsetUpgrade(before, before)
    converted = _convert(model, target)
    logger.info("converted the model from opset %d to %d", before, target)
    return converted, OpsetUpgrade(before, target)


def _convert(model: ir.Model, target: int) -> ir.Model:
    try:
        ir.external_data.load_to_model(model)  # the converter reads a self-contained proto
        proto = ir.to_proto(model)
        if proto.ByteSize() > PROTOBUF_LIMIT_BYTES:
            raise ValueError("the model is over protobuf's 2 GB limit")
        converted = onnx.version_converter.convert_version(proto, target)
        onnx.checker.check_model(converted)
        return ir.serde.deserialize_model(converted)
    except Exception as exc:  # the converter raises bare RuntimeErrors; say which
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(
            f"cannot convert this model to opset {target}: {_short(why)}; {_ADVICE}"
        ) from None


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
