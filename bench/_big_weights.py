"""The synthetic decoder's weight types: fp32, fp16 and int4 as onnxruntime-genai writes it.

``Weights("int4", block_size)`` is the model builder's int4: every projection (and the
lm head) is a ``com.microsoft.MatMulNBits`` (onnxruntime's ContribOperators.md): ``Y = A
@ dequant(B)^T`` with ``B`` ``uint8[N, k_blocks, block_size / 2]``, two 4-bit codes a
byte, the lower nibble first along K; ``scales`` ``float[N * k_blocks]``, the type of A;
no ``zero_points``, so each code ``q`` means ``(q - 8) * scale``, symmetric, as the
builder quantizes by default. The codes are drawn from 1..15 (-7..7 around the implied
zero point 8: mean 0, standard deviation sqrt(56 / 3)) and the scales make a column's
weights ``N(0, 1 / fan_in)``-sized, times ``uniform(0.5, 1.5)`` per block: nothing a
constant would pass for. The token embedding stays fp32 (a Gather, as the builder's).

``Weights("fp16")`` is the whole model in fp16, as an fp16 export (``model.half()``) is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KINDS = ("fp32", "fp16", "int4")
BITS = 4
_ZERO_POINT = 1 << (BITS - 1)  # MatMulNBits' default without zero_points: 8
_CODE_STD = math.sqrt(56 / 3)  # of the codes 1..15 around 8: (2 * (1 + 4 + ... + 49) / 15)^.5
# the builder's CPU default (accuracy_level 4): A quantized to int8 inside the kernel, so
# a change of 1e-7 in A can move a rounding; 0 computes in fp32 from dequantized weights
ACCURACY_LEVEL = 4


@dataclass(frozen=True)
class Weights:
    kind: str = "fp32"
    block_size: int = 32
    accuracy_level: int = ACCURACY_LEVEL  # MatMulNBits' (int4 only)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"weights {self.kind!r}: give one of {', '.join(KINDS)}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block size {self.block_size}: give a power of two, at least 16")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"accuracy level {self.accuracy_level}: give 0 to 4")

    @property
    def dtype(self) -> type:
        """The activations' and float weights' dtype."""
        return np.float16 if self.kind == "fp16" else np.float32

    def matrix_bytes(self, rows: int, cols: int) -> int:
        """Bytes of a projection ``[rows (fan in), cols]`` as stored."""
        if self.kind == "int4":
            blocks = math.ceil(rows / self.block_size)
            return cols * blocks * (self.block_size * BITS // 8 + 4)
        return rows * cols * np.dtype(self.dtype).itemsize

    def vector_bytes(self, size: int) -> int:
        return size * np.dtype(self.dtype).itemsize


FP32 = Weights()


def quantize_random(
    rng: np.random.Generator, rows: int, cols: int, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Random int4 weights for ``x[.., rows] @ W[rows, cols]``: (B, scales) of MatMulNBits,
    ``B`` ``uint8[cols, k_blocks, block_size / 2]``, ``scales`` ``float32[cols * k_blocks]``.
    Rows past ``rows`` in the last block (when ``block_size`` does not divide it) are zero
    codes' worth of padding the kernel never reads."""
    blocks = math.ceil(rows / block_size)
    codes = rng.integers(1, 16, (cols, blocks * block_size), dtype=np.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # lower nibble first along K
    del codes
    spread = rng.uniform(0.5, 1.5, (cols, blocks)).astype(np.float32)
    scales = spread * np.float32(1 / (_CODE_STD * math.sqrt(rows)))
    return packed.reshape(cols, blocks, block_size // 2), scales.reshape(-1)


def dequantize(packed: np.ndarray, scales: np.ndarray, rows: int) -> np.ndarray:
    """The float ``W[rows, cols]`` that MatMulNBits with ``packed`` and ``scales`` means
    (for tests: what the kernel computes, up to its own rounding of A)."""
    cols, blocks, half = packed.shape
    codes = np.empty((cols, blocks, 2 * half), np.float32)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    values = (codes - _ZERO_POINT) * scales.reshape(cols, blocks, 1)
    return values.reshape(cols, -1)[:, :rows].T
