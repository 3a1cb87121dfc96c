"""Triton's counter-based RNG (``tl.randint`` / ``tl.rand``) in plain torch int64 arithmetic.

The attention kernels draw their dropout keep-mask from Philox-4x32-10 with the 64-bit element counter split
into the two low counter words (``tl.philox(seed, lo, hi, 0, 0)``, word 0 of the result); the CPU paths and the
reference rebuild the same mask here, bit for bit, so tests compare the two exactly.

Source: ``triton/language/random.py`` (Triton 3.4-3.9): ``philox_impl`` (uint32 branch), ``philox`` (the seed's
low / high 32 bits are the two key words), ``randint4x`` and ``uint_to_uniform_float``. From Triton 3.4 on
(triton-lang/triton PR #6832) ``tl.randint`` with an int64 offset does exactly this split (``offset_lo =
offset.to(uint32)``, ``offset_hi = (offset >> 32).to(uint32)``); earlier Triton versions run a 64-bit Philox with
other constants on a 64-bit offset. The kernels call ``tl.philox`` with the two words themselves, so their stream
is the same on every version.

uint32 values are held in int64 tensors (0 <= x < 2**32); products are formed from 16-bit halves so that no
intermediate leaves the int64 range.
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
# philox_impl, uint32 branch: the Weyl key increments (golden ratio and sqrt(3) - 1 as 32-bit fractions) and the
# round multipliers of Philox-4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
N_ROUNDS = 10  # random.py's N_ROUNDS_DEFAULT, what tl.philox / tl.rand use unless told otherwise
# uint_to_uniform_float, 32-bit branch: "maximum value such that MAX_INT * scale < 1.0 (with float rounding)".
UNIFORM_SCALE = 4.6566127342e-10


def _mulhilo(a: Tensor, b: int) -> tuple[Tensor, Tensor]:
    """(high, low) 32-bit words of the 64-bit product of uint32 ``a`` (int64 tensor) and the constant ``b``."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b >> 16, b & 0xFFFF
    low = a_lo * b_lo  # < 2**32
    mid = a_hi * b_lo + a_lo * b_hi  # < 2**33
    high = a_hi * b_hi + ((mid + (low >> 16)) >> 16)
    return high & _MASK32, ((mid << 16) + low) & _MASK32


def philox(seed: Union[int, Tensor], c0: Tensor, c1: Tensor, c2: Tensor, c3: Tensor) -> tuple[Tensor, ...]:
    """``tl.philox(seed, c0, c1, c2, c3)`` for uint32 counter words: 10 rounds, key = (seed low, seed high)."""
    k0 = seed & _MASK32
    k1 = (seed >> 32) & _MASK32
    for _ in range(N_ROUNDS):
        hi_b, lo_b = _mulhilo(c2, PHILOX_ROUND_B)
        hi_a, lo_a = _mulhilo(c0, PHILOX_ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _MASK32
        k1 = (k1 + PHILOX_KEY_B) & _MASK32
    return c0, c1, c2, c3


def randint(seed: Union[int, Tensor], offset: Tensor) -> Tensor:
    """``tl.randint(seed, offset)`` for an int64 offset (Triton >= 3.4): uint32 values in an int64 tensor."""
    zero = torch.zeros_like(offset)
    return philox(seed, offset & _MASK32, (offset >> 32) & _MASK32, zero, zero)[0]


def uint_to_uniform_float(x: Tensor) -> Tensor:
    """``tl.uint_to_uniform_float`` for uint32 input: fold the int32 sign (x < 0 -> ~x), then an fp32 multiply."""
    signed = torch.where(x >= 2**31, x - 2**32, x)
    folded = torch.where(signed < 0, ~signed, signed)
    return folded.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32)


def rand(seed: Union[int, Tensor], offset: Tensor) -> Tensor:
    """``tl.rand(seed, offset)`` for an int64 offset: fp32 in [0, 1)."""
    return uint_to_uniform_float(randint(seed, offset))


def attention_counters(Z: int, H: int, M: int, N: int, row0: int, rows: int, device) -> Tensor:
    """The Philox counter of score element (z, h, i, j), i in [row0, row0 + rows): ((z * H + h) * M + i) * N + j,
    int64, shape [Z, H, rows, N] -- unique within one call for any Z * H * M * N < 2**63."""
    zh = torch.arange(Z * H, dtype=torch.int64, device=device).reshape(Z, H, 1, 1)
    i = torch.arange(row0, row0 + rows, dtype=torch.int64, device=device).reshape(1, 1, rows, 1)
    j = torch.arange(N, dtype=torch.int64, device=device).reshape(1, 1, 1, N)
    return (zh * M + i) * N + j


def dropout_keep(seed: Tensor, dropout_p: float, Z: int, H: int, M: int, N: int, row0: int, rows: int) -> Tensor:
    """The attention kernels' keep-mask of rows [row0, row0 + rows): ``rand >= p`` with p rounded to fp32 as the
    kernels receive it. ``seed`` is the int64 scalar tensor the kernels load. Bool, [Z, H, rows, N]."""
    u = rand(seed.to(torch.int64), attention_counters(Z, H, M, N, row0, rows, seed.device))
    return u >= torch.tensor(dropout_p, dtype=torch.float32, device=seed.device)
