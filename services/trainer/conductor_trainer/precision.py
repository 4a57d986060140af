"""Numeric precision for TRL's trainers: bf16 autocast wherever it is faster than float32.

On a GPU, bf16. On a CPU it depends on the chip, by a factor of a hundred either way: with bf16
matrix units (Intel AMX, AVX512-BF16) a bf16 matmul ran 4.4x faster than float32 on a 2-core
Xeon, and a SmolLM2-135M training step 2.3x faster; without them, bf16 autocast sends every
matmul to a scalar kernel (1 GFLOP/s against 56 in float32 on another 2-core x86 machine), and a
step takes minutes instead of seconds. So on a CPU the choice is measured, once per process. The
weights stay float32 either way (autocast computes in bf16), so the optimizer's updates are not
rounded away.
"""

from __future__ import annotations

import functools
import time
from typing import Literal, TypedDict

from conductor.errors import ConfigurationError

PrecisionChoice = Literal["auto", "bf16", "fp32"]
PRECISION_CHOICES: tuple[PrecisionChoice, ...] = ("auto", "bf16", "fp32")
# bf16 is chosen on a CPU when its matmuls run at least this much faster than float32's.
CPU_BF16_MIN_SPEEDUP = 1.5


class Precision(TypedDict):
    bf16: bool
    fp16: bool


@functools.cache
def cpu_bf16_speedup(size: int = 512, repeats: int = 5) -> float:
    """How many times faster a ``size`` square matmul runs in bf16 than in float32 on this CPU
    (best of ``repeats`` each; about 10 ms where bf16 is fast, under 2 s where it is not)."""
    import torch

    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        matrix = torch.randn(size, size).to(dtype)
        matrix @ matrix  # the first call picks and primes the kernel
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            matrix @ matrix
            best = min(best, time.perf_counter() - started)
        seconds[dtype] = best
    return seconds[torch.float32] / max(seconds[torch.bfloat16], 1e-9)


def uses_bf16(choice: PrecisionChoice, *, use_cpu: bool) -> bool:
    if choice not in PRECISION_CHOICES:
        raise ConfigurationError(
            f"precision must be one of {', '.join(PRECISION_CHOICES)}, not {choice!r}"
        )
    if choice != "auto":
        return choice == "bf16"
    return not use_cpu or cpu_bf16_speedup() >= CPU_BF16_MIN_SPEEDUP


def precision_fields(*, use_cpu: bool, choice: PrecisionChoice = "auto") -> Precision:
    return Precision(bf16=uses_bf16(choice, use_cpu=use_cpu), fp16=False)
