"""The training steps' matrix-product precision (config `precision`).

float32 changes nothing. tf32 lets CUDA's tensor cores multiply float32 matrices with 10-bit
mantissas (storage stays float32); bf16 runs the forward passes under autocast, so matrix products
and convolutions take bfloat16 while weights, gradients and Adam's moments stay float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def matmul_precision(precision: str, device: torch.device) -> Iterator[None]:
    """Run the enclosed steps at `precision` on `device`. tf32's switches are torch's
    process-wide flags, set for the steps and put back after them (a GPU tile trains in one
    thread); autocast is per thread, so each of a CPU tile's stacks enters its own."""
    if precision == "float32":
        yield
    elif precision == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    elif precision == "tf32":
        if device.type != "cuda":
            raise ValueError(f"precision tf32 needs a CUDA device, not {device}")
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    else:
        raise ValueError(f"unknown precision {precision!r}: float32, tf32 or bf16")
