"""Numeric precision for TRL's trainers, which turn bf16 on by default."""

from __future__ import annotations

from typing import TypedDict


class Precision(TypedDict):
    bf16: bool
    fp16: bool


def precision_fields(*, use_cpu: bool) -> Precision:
    """bf16 on a GPU, float32 on a CPU. On a CPU without bf16 matrix units, bf16 autocast sends
    every matmul to a scalar kernel: 1 GFLOP/s against 56 in float32 on a 2-core x86 machine,
    so a training step took minutes instead of seconds."""
    return Precision(bf16=not use_cpu, fp16=False)
