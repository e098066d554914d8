"""One cell of the grid and its iteration: fitness → selection → training → replacement → mixture.

Pure: a function of (cell state, neighbour snapshots, data, rng) → new cell state.
No sockets, files or clocks here; runners measure time and move snapshots.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from palomino.coevolution.fitness import aggregate, loss_table
from palomino.coevolution.individual import Individual, Population, Role, make_adam
from palomino.coevolution.mixture import MixtureScore, evolve_weights
from palomino.coevolution.mutation import mutate_learning_rates
from palomino.coevolution.selection import neighbourhood_select, replace
from palomino.config import ExperimentConfig
from palomino.data import Dataset, class_subset, diet, label_count
from palomino.grid import ClassGrid, Coord, Topology
from palomino.nn import apply, build_discriminator, build_generator, get_loss
from palomino.wire import IndividualMeta, Snapshot, SnapshotHeader


def cell_seed(seed: int, coord: Coord) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, coord[0], coord[1]])


@dataclass
class IterationReport:
    """What one iteration of one cell did: one line of metrics.jsonl (without timings)."""

    iteration: int
    cell: Coord
    epoch: int
    generator: dict[str, float]
    discriminator: dict[str, float]
    losses_used: dict[str, int]
    score: float
    mixture: dict[str, float]
    neighbours: dict[str, int]
    label: int | None = None  # the class of a partitioned run's cell
    steps: dict[str, int] | None = None  # optimiser steps taken: {"generator": n, "discriminator": m}

    def to_json(self) -> dict[str, Any]:
        record = {
            "iteration": self.iteration,
            "cell": list(self.cell),
            "epoch": self.epoch,
            "generator": self.generator,
            "discriminator": self.discriminator,
            "losses_used": self.losses_used,
            "score": self.score,
            "mixture": self.mixture,
            "neighbours": self.neighbours,
        }
        if self.label is not None:
            record["class"] = self.label
        if self.steps is not None:
            record["steps"] = self.steps
        return record


class Cell:
    """One cell. On a class's sub-grid (`topology` a ClassGrid) it trains on that class's
    samples of `dataset` only; with a conditional network, on (sample, label) pairs."""

    def __init__(
        self,
        coord: Coord,
        topology: Topology | ClassGrid,
        config: ExperimentConfig,
        dataset: Dataset,
        *,
        experiment: str,
        device: str | torch.device = "cpu",
    ) -> None:
        self.coord = Coord(*coord)
        self.topology = topology
        self.config = config
        self.experiment = experiment
        self.device = torch.device(device)
        self.label: int | None = topology.label if isinstance(topology, ClassGrid) else None
        if config.partitioned and self.label is None:
            raise ValueError(
                f"cell {self.coord}: a partitioned experiment's cell needs its class's sub-grid "
                "(palomino.grid.class_grid_at), not the whole grid"
            )
        if self.label is not None:
            dataset = class_subset(dataset, self.label)
        if config.training.data_diet < 1:  # data dieting: a share of its own, seeded by the coordinate
            share_seed = int(cell_seed(config.seed, self.coord).spawn(3)[2].generate_state(1)[0])
            dataset = diet(dataset, config.training.data_diet, share_seed)
        self.data = dataset.samples.to(self.device)
        self.sample_shape = dataset.sample_shape
        self.kind = dataset.kind
        self.conditional = config.network.conditional
        self.label_count: int | None = None
        self.labels: torch.Tensor | None = None  # conditional only: each sample's label
        self.classes: list[int] = []  # conditional only: the labels present, for pictures
        if self.conditional:
            if dataset.labels is None:
                raise ValueError(f"network.conditional needs labelled data; {dataset.name} has no labels")
            self.label_count = label_count(dataset)
            self.labels = dataset.labels.to(self.device)
            self.classes = sorted(set(dataset.labels.tolist()))
        training = config.training
        self.fitness_loss = get_loss(training.losses[0])
        self.iteration = 0  # iterations completed

        seeds = cell_seed(config.seed, self.coord).spawn(2)
        self.rng = np.random.Generator(np.random.PCG64(seeds[0]))
        self.torch_rng = torch.Generator(device=self.device)
        self.torch_rng.manual_seed(int(seeds[1].generate_state(1)[0]))
        self.generators = Population([self._new_individual("generator") for _ in range(training.population_size)])
        self.discriminators = Population(
            [self._new_individual("discriminator") for _ in range(training.population_size)]
        )
        # Reused modules that hold neighbours' snapshot weights (no allocation per iteration).
        self._slots: dict[tuple[Coord, Role], nn.Module] = {}
        self.mixture_weights: dict[str, float] = {str(self.coord): 1.0}
        self.score = float("nan")
        self._order = torch.randperm(len(self.data), generator=self._cpu_rng(), device="cpu")
        self._order_on_device = self._order.to(self.device)  # moved once per epoch, not per batch
        self._cursor = 0

    def relocate(self, coord: Coord, topology: Topology | ClassGrid) -> None:
        """Move to another coordinate / grid (a distributed run shrank); the individuals come along."""
        label = topology.label if isinstance(topology, ClassGrid) else None
        if label != self.label:
            raise ValueError(f"cell {self.coord} trains class {self.label}; it cannot move to class {label}'s sub-grid")
        self.coord, self.topology = Coord(*coord), topology
        self._slots.clear()
        for ind in [*self.generators, *self.discriminators]:
            ind.origin = str(self.coord)

    # ---- construction -------------------------------------------------------------------

    def _cpu_rng(self) -> torch.Generator:
        # Data order is drawn on the CPU so a run's batches do not depend on the device.
        return torch.Generator().manual_seed(int(self.rng.integers(2**62)))

    def _build(self, role: Role, seed: int | None = None) -> nn.Module:
        build = build_generator if role == "generator" else build_discriminator
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.rng.integers(2**62)) if seed is None else seed)
            return build(self.config.network, self.sample_shape, self.kind, self.label_count).to(self.device)

    def _new_individual(self, role: Role) -> Individual:
        network = self._build(role)
        lr = self.config.training.learning_rate
        optimizer = make_adam(network, lr, self.config.training.adam_betas)
        return Individual(role, network, optimizer, lr, origin=str(self.coord))

    # ---- data -----------------------------------------------------------------------------

    def _batches_per_iteration(self) -> int:
        training = self.config.training
        return training.batches_per_iteration or max(1, len(self.data) // training.batch_size)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next training batch and, for a conditional network, its labels."""
        size = min(self.config.training.batch_size, len(self.data))
        if self._cursor + size > len(self._order):
            self._order = torch.randperm(len(self.data), generator=self._cpu_rng())
            self._order_on_device = self._order.to(self.device)
            self._cursor = 0
        index = self._order_on_device[self._cursor : self._cursor + size]
        self._cursor += size
        return self._take(index)

    def _random_real(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        index = torch.from_numpy(self.rng.integers(0, len(self.data), size=n)).to(self.device)
        return self._take(index)

    def _take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.data[index], None if self.labels is None else self.labels[index]

    def _sampled_labels(self, n: int) -> torch.Tensor | None:
        """Labels for generated samples, drawn from the class priors (the labels of random samples)."""
        if self.labels is None:
            return None
        return self.labels[torch.from_numpy(self.rng.integers(0, len(self.labels), size=n)).to(self.device)]

    def _noise(self, n: int) -> torch.Tensor:
        latent = self.config.network.latent_dim
        return torch.randn(n, latent, generator=self.torch_rng, device=self.device)

    # ---- neighbours -----------------------------------------------------------------------

    def _from_snapshot(self, snapshot: Snapshot, role: Role) -> Individual:
        coord = Coord(*snapshot.header.cell)
        meta: IndividualMeta = getattr(snapshot.header, role)
        key = (coord, role)
        if key not in self._slots:
            # Weights come from the snapshot next, so the seed is irrelevant: a fixed one keeps
            # self.rng's stream the same for a fresh and a restored cell.
            self._slots[key] = self._build(role, seed=0)
        network = self._slots[key]
        individual = Individual(
            role,
            network,
            make_adam(network, meta.learning_rate, self.config.training.adam_betas),
            meta.learning_rate,
            meta.fitness,
            meta.loss,
            origin=str(coord),
        )
        individual.load_tensors(_on(self.device, snapshot.tensors, role + "."), role)
        return individual

    # ---- the iteration -------------------------------------------------------------------

    def iterate(self, neighbours: Mapping[Coord, Snapshot]) -> IterationReport:
        """Run one iteration against the given neighbour snapshots (one per neighbour at most)."""
        training = self.config.training
        others = [Coord(*c) for c in self.topology.neighbours(self.coord) if Coord(*c) in neighbours]
        foreign_g = [self._from_snapshot(neighbours[c], "generator") for c in others]
        foreign_d = [self._from_snapshot(neighbours[c], "discriminator") for c in others]
        all_g = [*self.generators, *foreign_g]
        all_d = [*self.discriminators, *foreign_d]

        # Fitness: all-vs-all on one shared draw of noise and real data (a conditional network's
        # fakes take the real draw's labels: one draw from the priors, and pairs of one class).
        z_fit = self._noise(training.fitness.sample_size)
        real_fit, y_fit = self._random_real(training.fitness.sample_size)
        fakes = self._generate(all_g, z_fit, y_fit)
        g_table, d_table, d_reals = loss_table(
            fakes, [d.network for d in all_d], real_fit, self.fitness_loss, labels=y_fit
        )
        mode = training.fitness.mode
        for ind, value in zip(all_g, aggregate(g_table, mode, dim=1).tolist()):
            ind.fitness = value
        for ind, value in zip(all_d, aggregate(d_table, mode, dim=0).tolist()):
            ind.fitness = value

        # Selection over the neighbourhood (or, when no one migrates this iteration, the cell
        # alone) builds the new local populations.
        new_g = self._select(all_g, len(self.generators))
        new_d = self._select(all_d, len(self.discriminators))

        losses_used, g_losses, d_losses = self._train(new_g, new_d)

        # Re-evaluate the trained individuals against the neighbourhood, then replace the worst.
        new_fakes = self._generate(new_g, z_fit, y_fit)
        # The neighbourhood's discriminators have not changed since: reuse their logits on real data.
        g_new_table, _, _ = loss_table(
            new_fakes, [d.network for d in all_d], real_fit, self.fitness_loss, d_reals, y_fit
        )
        _, d_new_table, _ = loss_table(fakes, [d.network for d in new_d], real_fit, self.fitness_loss, labels=y_fit)
        for ind, value in zip(new_g, aggregate(g_new_table, mode, dim=1).tolist()):
            ind.fitness, ind.origin = value, str(self.coord)
        for ind, value in zip(new_d, aggregate(d_new_table, mode, dim=0).tolist()):
            ind.fitness, ind.origin = value, str(self.coord)
        self.generators = self._replace(self.generators, new_g)
        self.discriminators = self._replace(self.discriminators, new_d)

        self._evolve_mixture([self.generators.best, *foreign_g], [self.coord, *others])

        report = IterationReport(
            iteration=self.iteration,
            cell=self.coord,
            epoch=self.topology.epoch,
            generator=self._summary(self.generators.best, g_losses),
            discriminator=self._summary(self.discriminators.best, d_losses),
            losses_used=dict(sorted(losses_used.items())),
            score=self.score,
            mixture=dict(self.mixture_weights),
            neighbours={str(c): neighbours[c].iteration for c in others},
            label=self.label,
            steps={"generator": len(g_losses), "discriminator": len(d_losses)},
        )
        self.iteration += 1
        return report

    def _select(self, candidates: list[Individual], local: int) -> list[Individual]:
        """Clones of the tournament's winners; `candidates` holds the `local` individuals first."""
        training = self.config.training
        winners = neighbourhood_select(
            candidates,
            [ind.fitness for ind in candidates],
            local,
            training.population_size,
            training.tournament_size,
            self.rng,
            migration=training.selection.migration,
            margin=training.selection.margin,
        )
        return [ind.clone() for ind in winners]

    def _replace(self, population: Population, trained: list[Individual]) -> Population:
        training = self.config.training
        return Population(
            replace(
                list(population),
                [i.fitness for i in population],
                trained,
                [i.fitness for i in trained],
                training.replacements,
                training.selection.replacement,
            )
        )

    @staticmethod
    def _summary(best: Individual, losses: list[torch.Tensor]) -> dict[str, float]:
        return {
            "loss": float(torch.stack(losses).mean()) if losses else float("nan"),
            "fitness": best.fitness,
            "learning_rate": best.learning_rate,
        }

    @torch.no_grad()
    def _generate(
        self, generators: list[Individual], z: torch.Tensor, labels: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        return [apply(g.network, z, labels) for g in generators]

    def _train(
        self, new_g: list[Individual], new_d: list[Individual]
    ) -> tuple[Counter[str], list[torch.Tensor], list[torch.Tensor]]:
        """Each batch: every selected generator steps against a random selected discriminator,
        then every selected discriminator against a random selected generator (Lipizzaner's
        order and opponents: the sub-populations that selection drew from the neighbourhood,
        which adapt to each other, not the neighbours' frozen snapshots).

        Conditional networks: the generator's labels are drawn from the class priors; the
        discriminator sees the real batch with its labels and fakes made with the same labels.

        Step losses stay on the device (no per-step synchronisation); they are averaged once."""
        training = self.config.training
        params = {id(ind): list(ind.network.parameters()) for ind in [*new_g, *new_d]}
        losses = {name: get_loss(name) for name in training.losses}
        losses_used: Counter[str] = Counter()
        g_losses: list[torch.Tensor] = []
        d_losses: list[torch.Tensor] = []
        skip = training.discriminator_skip_each_nth_step
        for step in range(self._batches_per_iteration()):
            real, real_labels = self._next_batch()
            loss_name = training.losses[int(self.rng.integers(len(training.losses)))]
            loss = losses[loss_name]
            losses_used[loss_name] += 1
            # WGAN-GP: the critic takes n_critic steps per generator step.
            if loss_name != "wgan_gp" or step % training.n_critic == 0:
                for ind in new_g:
                    self._mutate(ind)
                    opponent = new_d[int(self.rng.integers(len(new_d)))].network
                    if real_labels is None:
                        value = loss.generator(opponent(ind.network(self._noise(real.shape[0]))))
                    else:
                        labels = self._sampled_labels(real.shape[0])
                        value = loss.generator(opponent(ind.network(self._noise(real.shape[0]), labels), labels))
                    ind.optimizer.zero_grad(set_to_none=True)
                    value.backward(inputs=params[id(ind)])
                    ind.optimizer.step()
                    ind.loss = loss_name
                    g_losses.append(value.detach())
            if skip == 0 or step % (skip + 1) == 0:
                for ind in new_d:
                    self._mutate(ind)
                    opponent = new_g[int(self.rng.integers(len(new_g)))].network
                    with torch.no_grad():
                        fake = apply(opponent, self._noise(real.shape[0]), real_labels)
                    value = loss.discriminator(ind.network, real, fake, generator=self.torch_rng, labels=real_labels)
                    ind.optimizer.zero_grad(set_to_none=True)
                    value.backward(inputs=params[id(ind)])
                    ind.optimizer.step()
                    ind.loss = loss_name
                    d_losses.append(value.detach())
        return losses_used, g_losses, d_losses

    def _mutate(self, ind: Individual) -> None:
        mutation = self.config.training.mutation
        (rate,) = mutate_learning_rates(
            [ind.learning_rate], self.config.training.learning_rate, mutation.probability, mutation.alpha, self.rng
        )
        ind.set_learning_rate(rate)

    def _evolve_mixture(self, generators: list[Individual], coords: list[Coord]) -> None:
        mixture = self.config.training.mixture
        keys = [str(c) for c in coords]
        # Weights persist while the neighbourhood does; a new one (first iteration, resize)
        # starts from equal shares, as Lipizzaner's mixtures do.
        if set(keys) == set(self.mixture_weights) and sum(self.mixture_weights.values()) > 0:
            weights = np.array([self.mixture_weights[k] for k in keys], dtype=np.float64)
            weights /= weights.sum()
        else:
            weights = np.full(len(keys), 1.0 / len(keys))
        score = self.mixture_score(generators, mixture.score_samples)
        weights, self.score = evolve_weights(weights, score, mixture.sigma, mixture.es_steps, self.rng)
        self.mixture_weights = dict(zip(keys, weights.tolist()))

    def mixture_score(self, generators: list[Individual], samples: int) -> MixtureScore:
        per_component = max(2, -(-samples // len(generators)))
        z = self._noise(per_component)
        fakes = self._generate(generators, z, self._sampled_labels(per_component))
        return MixtureScore.from_samples(fakes, self._random_real(samples)[0])

    def picture_labels(self, n: int) -> torch.Tensor | None:
        """Labels for a picture of n conditional samples: each class in turn, in equal blocks."""
        if not self.conditional:
            return None
        classes = torch.tensor(self.classes, device=self.device)
        return classes[torch.arange(n, device=self.device) * len(classes) // n]

    @torch.no_grad()
    def samples(self, n: int) -> torch.Tensor:
        """n samples of the centre generator (generator space), for pictures of progress."""
        network = self.generators.best.network
        network.eval()
        try:
            return apply(network, self._noise(n), self.picture_labels(n)).cpu()
        finally:
            network.train()

    # ---- snapshots and checkpoints ---------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The centre individuals as neighbours see them: iteration = last completed (−1 before any)."""
        g, d = self.generators.best, self.discriminators.best
        header = SnapshotHeader(
            experiment=self.experiment,
            cell=tuple(self.coord),
            epoch=self.topology.epoch,
            iteration=self.iteration - 1,
            generator=IndividualMeta(learning_rate=g.learning_rate, fitness=_finite(g.fitness), loss=g.loss),
            discriminator=IndividualMeta(learning_rate=d.learning_rate, fitness=_finite(d.fitness), loss=d.loss),
            mixture=dict(self.mixture_weights),
            score=None if np.isnan(self.score) else self.score,
        )
        return Snapshot(header, {**g.tensors("generator"), **d.tensors("discriminator")})

    def neighbourhood_mixture(self, neighbours: Mapping[Coord, Snapshot]) -> list[tuple[str, float, Individual]]:
        """The cell's mixture components as it sees them now: (coord, weight, generator)."""
        parts = [(str(self.coord), self.generators.best)]
        for coord in self.topology.neighbours(self.coord):
            if coord in neighbours and str(coord) in self.mixture_weights:
                parts.append((str(coord), self._from_snapshot(neighbours[coord], "generator")))
        return [(key, self.mixture_weights.get(key, 0.0), ind) for key, ind in parts]

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything needed to resume this cell: tensors for safetensors, metadata for JSON."""
        tensors: dict[str, torch.Tensor] = {"data.order": self._order.clone()}
        tensors["rng.torch"] = self.torch_rng.get_state()
        meta: dict[str, Any] = {
            "cell": list(self.coord),
            "iteration": self.iteration,
            "epoch": self.topology.epoch,
            "cursor": self._cursor,
            "rng": self.rng.bit_generator.state,
            "mixture": self.mixture_weights,
            "score": None if np.isnan(self.score) else self.score,
            "individuals": {},
        }
        for role, population in (("generator", self.generators), ("discriminator", self.discriminators)):
            for index, ind in enumerate(population):
                prefix = f"{role}.{index}"
                tensors.update(ind.tensors(prefix))
                meta["individuals"][prefix] = {
                    "learning_rate": ind.learning_rate,
                    "fitness": _finite(ind.fitness),
                    "loss": ind.loss,
                    "origin": ind.origin,
                }
        return tensors, meta

    def adopt(self, snapshot: Snapshot) -> None:
        """Take over the individuals a (dead) cell last published at this coordinate, and its progress.

        Newer than its checkpoint but partial: every individual of a population becomes a copy of
        the published centre one; data order and random streams stay this cell's own.
        """
        header = snapshot.header
        for role, population in (("generator", self.generators), ("discriminator", self.discriminators)):
            meta: IndividualMeta = getattr(header, role)
            for ind in population:
                ind.learning_rate, ind.fitness, ind.loss = meta.learning_rate, meta.fitness, meta.loss
                ind.load_tensors(_on(self.device, snapshot.tensors, role + "."), role)  # sets the lr too
        self.iteration = header.iteration + 1
        self.mixture_weights = {str(k): float(v) for k, v in header.mixture.items()}
        self.score = float("nan") if header.score is None else float(header.score)

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Inverse of `state`; raises ValueError if the checkpoint does not fit this cell."""
        for role, population in (("generator", self.generators), ("discriminator", self.discriminators)):
            for index, ind in enumerate(population):
                prefix = f"{role}.{index}"
                info = meta["individuals"][prefix]
                ind.learning_rate = info["learning_rate"]
                ind.load_tensors(_on(self.device, tensors, prefix + "."), prefix)
                ind.fitness, ind.loss, ind.origin = info["fitness"], info["loss"], info["origin"]
        self.iteration = int(meta["iteration"])
        self._cursor = int(meta["cursor"])
        self._order = tensors["data.order"].clone()
        self._order_on_device = self._order.to(self.device)
        self.torch_rng.set_state(tensors["rng.torch"])
        self.rng.bit_generator.state = meta["rng"]
        self.mixture_weights = {str(k): float(v) for k, v in meta["mixture"].items()}
        self.score = float("nan") if meta["score"] is None else float(meta["score"])


def _on(device: torch.device, tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix`, on `device` (not the whole snapshot once per role)."""
    return {k: v.to(device) for k, v in tensors.items() if k.startswith(prefix)}


def _finite(value: float) -> float:
    # JSON has no infinity; an unevaluated individual's fitness is written as a large number.
    return value if np.isfinite(value) else 1e30
