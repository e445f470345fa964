"""What the engine leaves as it is, and why: the report's ``left_alone``.

autofusion fuses what its rules understand and keeps everything else exactly as the
model has it. These records tell the user which parts those were:

- ops of a domain no rule reads (``com.microsoft``, a vendor's custom ops);
- quantized ops (QuantizeLinear/DequantizeLinear and the integer kernels): a
  DequantizeLinear -> op -> QuantizeLinear unit is what onnxruntime runs in int8, so no
  rule may take the op out of it (``quantized_unit`` refuses such matches);
- float16 computation: fused by the same rules as float32, and checked at float16's
  tolerance (1e-2 relative, 1e-3 absolute);
- If/Loop/Scan bodies: searched like the main graph; listed so the user knows.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from autofusion.fusion_core.patterns import Match

__all__ = ["QUANTIZED_OPS", "left_alone", "quantized_unit"]

QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearAveragePool",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "QGemm",
        "QAttention",
        "MatMulNBits",
    }
)
_STANDARD = ("", "ai.onnx")
_FLOAT16 = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def quantized_unit(match: Match) -> str | None:
    """Why ``match`` must not be rewritten because it sits in a Q/DQ unit, or None."""
    for node in match.nodes.values():
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer.op_type == "DequantizeLinear":
                return (
                    f"{node.op_type} {node.name!r} reads DequantizeLinear "
                    f"{producer.name!r}: part of a quantized (QDQ) unit, kept so that "
                    "onnxruntime can run it in int8"
                )
        for value in node.outputs:
            for use in value.uses():
                if use.node.op_type == "QuantizeLinear":
                    return (
                        f"{node.op_type} {node.name!r} feeds QuantizeLinear "
                        f"{use.node.name!r}: part of a quantized (QDQ) unit, kept so that "
                        "onnxruntime can run it in int8"
                    )
    return None


def left_alone(model: ir.Model, bodies: int) -> list[dict]:
    """Records ``{"what", "nodes", "reason"}`` of the parts no rule rewrites."""
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    records = []
    domains = Counter(n.domain for n in nodes if n.domain not in _STANDARD)
    for domain, count in sorted(domains.items()):
        records.append(
            {
                "what": f"domain {domain}",
                "nodes": count,
                "reason": "no rule reads this domain's ops: kept as they are",
            }
        )
    quantized = sum(1 for n in nodes if n.op_type in QUANTIZED_OPS)
    if quantized:
        records.append(
            {
                "what": "quantized ops",
                "nodes": quantized,
                "reason": "quantized ops and the ops between a DequantizeLinear and a "
                "QuantizeLinear are kept, so that onnxruntime can still run them in int8",
            }
        )
    half = sum(1 for n in nodes if any(v.dtype in _FLOAT16 for v in n.outputs))
    if half:
        records.append(
            {
                "what": "float16 ops",
                "nodes": half,
                "reason": "fused by the same rules as float32 ones, and checked at float16's "
                "tolerance (rtol 1e-2, atol 1e-3)",
            }
        )
    if bodies:
        records.append(
            {
                "what": "If/Loop/Scan bodies",
                "nodes": sum(1 for n in nodes) - sum(1 for _ in model.graph),
                "reason": f"{bodies} bodies, each matched and rewritten on its own",
            }
        )
    return records
