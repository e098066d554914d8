"""A tile's training data on its device, kept between iterations, and its compiled steps."""

from __future__ import annotations

import torch
from torch import Tensor

from palomino.coevolution.cell_data import CellData
from palomino.coevolution.tile_compiled import CompiledBatch, compilable
from palomino.coevolution.tile_lanes import Lane, Role
from palomino.nn import get_loss


class TileData:
    """A tile's training data on its device as one tensor (the lanes' datasets side by side, each
    once however many lanes share it), with each lane's offset into it. Kept between iterations:
    a tile builds it once, and again only when a lane's data changes (a relocated cell)."""

    def __init__(self, compiled: bool = False, strict: bool = True, graphs: bool = False) -> None:
        self._datas: list[CellData] = []  # held, so that no other object can take their ids
        self._value: tuple[Tensor, Tensor | None, list[int]] | None = None
        self.compiled = compiled  # train through tile_compiled_steps.py where the networks allow
        # compile: on/graphs: a compiler failure is an error, and convolutional stacks compile too;
        # auto: a failure trains eager, and only perceptron stacks compile.
        self.strict = strict
        self.graphs = graphs  # compiled steps replayed as CUDA graphs (compile: graphs)
        self._batches: dict[int, CompiledBatch] = {}  # a batch size's compiled steps, kept for the run

    def compiled_batch(self, batch: int, g: Role, d: Role, losses: list[str]) -> CompiledBatch | None:
        """The compiled steps for stacks of this batch size (built on first use), or None: eager."""
        if not (self.compiled and compilable(g.layout, d.layout, asked=self.strict)):
            return None
        if batch not in self._batches:
            losses_ = [get_loss(name) for name in losses]
            self._batches[batch] = CompiledBatch(g.layout, d.layout, losses_, self.strict, self.graphs)
        return self._batches[batch]

    def of(self, lanes: list[Lane]) -> tuple[Tensor, Tensor | None, list[int]]:
        datas = [lane.training.data for lane in lanes]
        same = len(datas) == len(self._datas) and all(a is b for a, b in zip(datas, self._datas))
        if not same or self._value is None:
            self._datas, self._value = datas, self._build(datas)
        return self._value

    @staticmethod
    def _build(datas: list[CellData]) -> tuple[Tensor, Tensor | None, list[int]]:
        unique: dict[int, int] = {}  # the host dataset a lane's data came from → its offset in the tile's
        parts: list[CellData] = []
        offsets, total = [], 0
        for data in datas:
            if id(data.source) not in unique:
                unique[id(data.source)] = total
                parts.append(data)
                total += len(data.samples)
            offsets.append(unique[id(data.source)])
        if len(parts) == 1:  # one dataset for every lane (no regions): the first lane's, no copy
            return parts[0].samples, parts[0].labels, offsets
        samples = torch.cat([data.samples for data in parts])
        labels = None if parts[0].labels is None else torch.cat([data.labels for data in parts])  # type: ignore[misc]
        return samples, labels, offsets
