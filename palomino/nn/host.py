"""Every move between the host and the device in one place, so that its waits can be counted.

On a GPU, reading a value back (`.cpu()`, `.tolist()`, `float()`) makes the host wait for every
kernel queued before it, and so does an upload from pageable memory that is not `non_blocking`:
small networks there cost what they dispatch *and* what they wait for. The coevolution code moves
tensors only through these helpers; `counting()` tallies them (benchmarks/tiles.py --count-ops),
which on a CPU is the only way to see the syncs a GPU would make.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass
class Traffic:
    """What crossed between host and device while `counting()` was open (in its context)."""

    reads: int = 0  # device → host: each one a host sync on a GPU
    uploads: int = 0  # host → device, queued without waiting


_TRAFFIC: ContextVar[Traffic | None] = ContextVar("palomino_host_traffic", default=None)


@contextmanager
def counting() -> Iterator[Traffic]:
    """Tally the transfers made in this context (this thread) until the block ends."""
    traffic = Traffic()
    token = _TRAFFIC.set(traffic)
    try:
        yield traffic
    finally:
        _TRAFFIC.reset(token)


def to_host(tensor: Tensor) -> Tensor:
    """`tensor` on the CPU: one read (a sync on a GPU), whatever its size."""
    traffic = _TRAFFIC.get()
    if traffic is not None:
        traffic.reads += 1
    return tensor.cpu()


def values(tensor: Tensor) -> list[Any]:
    """`tensor.tolist()` in one read."""
    return to_host(tensor).tolist()


def scalar(tensor: Tensor) -> float:
    """One number read back."""
    return float(to_host(tensor))


def upload(values: Tensor | Sequence[Any], device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """Host values on the device without waiting for it (the host runs ahead of queued kernels).
    A CPU tensor passed here must not be written to afterwards: the copy may still be reading it."""
    tensor = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None:
        tensor = tensor.to(dtype)
    traffic = _TRAFFIC.get()
    if traffic is not None:
        traffic.uploads += 1
    return tensor.to(device, non_blocking=True)


def upload_all(arrays: dict[str, np.ndarray], device: torch.device) -> dict[str, Tensor]:
    """Host arrays of one dtype on the device in one copy, cut back into one view each."""
    flat = upload(torch.from_numpy(np.concatenate([value.ravel() for value in arrays.values()])), device)
    out, start = {}, 0
    for name, value in arrays.items():
        out[name] = flat[start : start + value.size].view(value.shape)
        start += value.size
    return out
