"""The all-vs-all fitness of every cell of a tile in one stacked evaluation, read back once.

A cell alone evaluates its neighbourhood's generators and discriminators in a few stacked calls
(fitness.py); a tile of K cells made K times those calls, each with its own read-back. Here every
cell's generators are one stack and every cell's discriminators another, each member fed its own
cell's inputs, so the tile's fitness costs the calls of one cell and one read. Each member sees
exactly the inputs, in the layout, that fitness.py gives it (the same rows, one long batch or, with
minibatch std, one batch per input), so the tables are the ones each cell would compute.
Perceptrons only (their forward keeps no state); other networks stay cell by cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from palomino.nn import GanLoss
from palomino.nn.host import to_host
from palomino.nn.stacked import StackedMLP, gather, same_architecture, stack


@dataclass
class FitnessJob:
    """One cell's fitness: its generators' samples of `z`, judged with `real` by its discriminators."""

    generators: list[nn.Module]
    discriminators: list[nn.Module]
    z: Tensor
    real: Tensor
    labels: Tensor | None
    loss: GanLoss
    generators_needed: int | None = None  # rows of the generator table (None: all), as fitness_tables
    critics_needed: int | None = None  # columns of the discriminator table (None: all)
    fakes: list[Tensor] | None = None  # samples made already (then `generators` is not used)

    @property
    def sample_count(self) -> int:
        """How many generators' samples the discriminators judge."""
        return len(self.generators) if self.fakes is None else len(self.fakes)


@dataclass
class FitnessResult:
    fakes: list[Tensor]  # each generator's samples of the job's z
    g_table: Tensor  # (G, D) on the host: generator losses
    d_table: Tensor  # (G, D) on the host: discriminator losses


def batchable(jobs: Sequence[FitnessJob]) -> bool:
    """Whether these jobs evaluate as one stack: perceptrons of one architecture everywhere, one
    loss, and the same counts and sizes in every job."""
    if not jobs:
        return False
    first = jobs[0]

    def shape(job: FitnessJob) -> tuple:
        return (job.sample_count, len(job.discriminators), tuple(job.z.shape), tuple(job.real.shape), job.fakes is None)

    if any(
        shape(j) != shape(first)
        or j.loss is not first.loss
        or (j.generators_needed, j.critics_needed) != (first.generators_needed, first.critics_needed)
        or (j.labels is None) != (first.labels is None)
        for j in jobs
    ):
        return False
    generators = [g for job in jobs for g in job.generators]
    discriminators = [d for job in jobs for d in job.discriminators]
    made = first.fakes is not None or same_architecture(generators)
    return made and first.sample_count > 0 and same_architecture(discriminators)


# Activations one batched evaluation may hold: a tile's cells are evaluated in chunks of jobs
# that fit (MNIST perceptrons, 1,000 fitness samples: ~90 MB a cell), and read back once.
ACTIVATION_BUDGET = {"cpu": 1 << 30, "cuda": 16 << 30}


@torch.no_grad()
def tile_fitness(jobs: Sequence[FitnessJob], exact: bool = True) -> list[FitnessResult]:
    """Every job's samples and tables, from a few stacked calls a chunk and one read. Tables are
    cut as fitness_tables cuts them (`generators` rows, `critics` columns) and computed as it
    computes them: the whole table in one evaluation, a part in two. `exact`: see `_forward`."""
    first = jobs[0]
    g_count, d_count = first.sample_count, len(first.discriminators)
    g_rows = g_count if first.generators_needed is None else first.generators_needed
    d_cols = d_count if first.critics_needed is None else first.critics_needed
    size = _chunk(jobs)
    chunks = [_evaluate(jobs[start : start + size], g_rows, d_cols, exact) for start in range(0, len(jobs), size)]
    # One read for the tile, cut into each job's tables on the host as numpy views (no torch op a job).
    back = to_host(torch.cat([values for _, values in chunks])).numpy()
    per_job = g_rows * d_count + g_count * d_cols
    tables = torch.from_numpy(back.reshape(len(jobs), per_job))
    g_tables = tables[:, : g_rows * d_count].reshape(len(jobs), g_rows, d_count).unbind()
    d_tables = tables[:, g_rows * d_count :].reshape(len(jobs), g_count, d_cols).unbind()
    fakes = [f for chunk, _ in chunks for f in chunk.unbind()]
    return [FitnessResult(list(f.unbind()), g, d) for f, g, d in zip(fakes, g_tables, d_tables)]


def _chunk(jobs: Sequence[FitnessJob]) -> int:
    """How many jobs one evaluation takes: the discriminators' widest layer on every input row."""
    first = jobs[0]
    width = max(p.shape[0] for p in first.discriminators[0].parameters() if p.dim() == 2)
    rows = len(first.discriminators) * (first.sample_count + 1) * len(first.real)
    budget = ACTIVATION_BUDGET.get(first.real.device.type, ACTIVATION_BUDGET["cuda"])
    return max(1, budget // (rows * width * first.real.element_size() * 3))


def _evaluate(jobs: Sequence[FitnessJob], g_rows: int, d_cols: int, exact: bool) -> tuple[Tensor, Tensor]:
    """(fakes (J, G, B, …), the jobs' tables flat on the device: each job's generator table
    (g_rows × D), then its discriminator table (G × d_cols))."""
    first = jobs[0]
    count, g_count, d_count = len(jobs), first.sample_count, len(first.discriminators)
    discriminators = [d for job in jobs for d in job.discriminators]
    d_layout = StackedMLP.of(discriminators[0])
    d_params = {k: v.detach() for k, v in stack(discriminators, d_layout.names).items()}
    labels = torch.stack([job.labels for job in jobs]) if first.labels is not None else None  # type: ignore[misc]
    if first.fakes is not None:
        fakes = torch.stack([torch.stack(job.fakes) for job in jobs])  # type: ignore[arg-type]
    else:
        fakes = generate_each([job.generators for job in jobs], torch.stack([job.z for job in jobs]), labels, exact)
    inputs = torch.cat([fakes, torch.stack([job.real for job in jobs])[:, None]], dim=1)  # (J, G+1, B, …)
    judge = _Judge(d_layout, d_params, count, labels, exact)
    loss = first.loss
    if g_rows == g_count and d_cols == d_count:
        logits = judge(inputs, d_count)  # (J, D, G+1, B)
        d_fake, d_real = logits[:, :, :g_count], logits[:, :, g_count]
        g_tables = loss.generator(d_fake).transpose(1, 2)  # (J, G, D)
        d_tables = loss.discriminator_from_logits(d_real[:, :, None], d_fake).transpose(1, 2)
    else:
        empty = fakes.new_zeros(count, 0)
        g_tables = loss.generator(judge(fakes[:, :g_rows], d_count)).transpose(1, 2) if g_rows else empty
        d_tables = empty
        if d_cols:
            logits = judge(inputs, d_cols)  # each cell's first `d_cols` discriminators
            own = loss.discriminator_from_logits(logits[:, :, g_count, None], logits[:, :, :g_count])
            d_tables = own.transpose(1, 2)
    return fakes, torch.cat([g_tables.reshape(count, -1), d_tables.reshape(count, -1)], dim=1).flatten()


@torch.no_grad()
def generate_each(
    generators: Sequence[Sequence[nn.Module]], z: Tensor, labels: Tensor | None, exact: bool = True
) -> Tensor:
    """Job j's generators each on z[j] (labels[j]), as fitness.generate gives one cell's theirs:
    samples (J, G, B, …) from one stacked call."""
    count, g_count = len(generators), len(generators[0])
    flat = [g for job in generators for g in job]
    layout = StackedMLP.of(flat[0])
    params = {k: v.detach() for k, v in stack(flat, layout.names).items()}
    fakes = _forward(
        layout, params, _per_member(z, g_count), None if labels is None else _per_member(labels, g_count), count, exact
    )
    return fakes.view(count, g_count, *fakes.shape[1:])


class _Judge:
    """Each cell's first `members` discriminators on that cell's inputs, every input its own batch
    (as fitness.apply_each feeds one cell's): logits (J, members, inputs, B)."""

    def __init__(
        self, layout: StackedMLP, params: dict[str, Tensor], count: int, labels: Tensor | None, exact: bool
    ) -> None:
        self.layout, self.params, self.count, self.labels, self.exact = layout, params, count, labels, exact
        self.per_cell = len(next(iter(params.values()))) // count

    def __call__(self, inputs: Tensor, members: int) -> Tensor:
        count, per_input, batch = self.count, inputs.shape[1], inputs.shape[2]
        params = self.params
        if members < self.per_cell:  # each cell's first `members`
            chosen = torch.arange(count * self.per_cell, device=inputs.device).view(count, self.per_cell)
            params = gather(self.params, chosen[:, :members].reshape(-1))
        labels = self.labels
        if self.layout.minibatch_std:  # each (member, input) pair its own member: batch statistics per input
            index = torch.arange(count * members, device=inputs.device).repeat_interleave(per_input)
            x = _per_member(inputs, members).reshape(count * members * per_input, batch, *inputs.shape[3:])
            y = None if labels is None else _per_member(labels, members * per_input)
            logits = _forward(self.layout, gather(params, index), x, y, count, self.exact)
        else:
            x = _per_member(inputs.reshape(count, per_input * batch, *inputs.shape[3:]), members)
            y = None if labels is None else _per_member(labels.repeat(1, per_input), members)
            logits = _forward(self.layout, params, x, y, count, self.exact)
        return logits.reshape(count, members, per_input, batch)


def _forward(
    layout: StackedMLP, params: dict[str, Tensor], x: Tensor, labels: Tensor | None, count: int, exact: bool
) -> Tensor:
    """`layout.forward` of all members, whose first len/count belong to the first job, and so on.
    `exact`, where a cell's own call would stack one member, on a CPU each job is its own call:
    torch multiplies a batch of one matrix with another kernel than a batch of many (the last bit
    differs), and a tile must give each cell exactly its own numbers (a CPU run repeats the runs
    before tiles batched the fitness, bit for bit). A GPU, or a count of what one dispatches,
    makes one call."""
    if not exact or len(x) != count or x.device.type != "cpu":
        return layout.forward(params, x, labels)
    return torch.cat(
        [
            layout.forward(
                {k: v[j : j + 1] for k, v in params.items()},
                x[j : j + 1],
                None if labels is None else labels[j : j + 1],
            )
            for j in range(count)
        ]
    )


def _per_member(values: Tensor, members: int) -> Tensor:
    """(J, …) → (J·members, …): each job's values for each of its members."""
    return values[:, None].expand(values.shape[0], members, *values.shape[1:]).reshape(-1, *values.shape[1:])
