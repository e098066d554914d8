"""One cell of the grid and its iteration: fitness → selection → training → replacement → mixture.

Pure: a function of (cell state, neighbour snapshots, data, rng) → new cell state.
No sockets, files or clocks here; runners measure time and move snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from palomino.coevolution import cell_state, iteration
from palomino.coevolution.cell_data import CellData, cell_dataset, cell_seed
from palomino.coevolution.ensemble_search import FrechetScore
from palomino.coevolution.fitness import aggregate, fitness_tables, generate
from palomino.coevolution.individual import Individual, Population, Role
from palomino.coevolution.iteration import FitnessDraw, IterationReport, MixtureDraw, Prepared, Selected
from palomino.coevolution.mixture_weights import MixtureScore, evolve_weights
from palomino.coevolution.networks import NeighbourSlots, Networks
from palomino.coevolution.selection import neighbourhood_select, replace
from palomino.coevolution.tile_fitness import FitnessJob
from palomino.coevolution.training import Steps, Training, stacked
from palomino.config import ExperimentConfig
from palomino.data import Dataset, label_count
from palomino.grid import ClassGrid, Coord, Topology
from palomino.nn import apply, get_loss
from palomino.nn.host import scalar, to_host
from palomino.nn.lipizzaner_cnn import IMAGE_SHAPE, lipizzaners_mnist_cnn
from palomino.nn.stacked import stackable
from palomino.wire import Snapshot

FEATURE_CHUNK = 32_768  # images a call of the feature net: 0.75 GB of its first activations


class Cell:
    """One cell. On a class's sub-grid (`topology` a ClassGrid) it trains on that class's
    samples of `dataset` only; with a conditional network, on (sample, label) pairs.

    Its parts: `data` (batches and draws), `networks` (new individuals), `slots` (neighbours'
    snapshots as individuals), `training` (the gradient steps); cell_state has its snapshot
    and checkpoint. All draw from one random stream, in a fixed order: a seed gives one run.
    (A little over 200 lines: what is left is the iteration's steps, read in their order.)
    """

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
        self.source = dataset  # the whole dataset: a relocated cell's regions are cut from it again
        dataset = cell_dataset(dataset, config, self.coord, topology, self.label)
        self.conditional = config.network.conditional
        self.label_count = label_count(dataset) if self.conditional else None
        self.fitness_loss = get_loss(config.training.losses[0])
        self.iteration = 0  # iterations completed

        seeds = cell_seed(config.seed, self.coord).spawn(2)
        self.rng = np.random.Generator(np.random.PCG64(seeds[0]))
        self.torch_rng = torch.Generator(device=self.device)
        self.torch_rng.manual_seed(int(seeds[1].generate_state(1)[0]))
        self.networks = Networks(config, dataset.sample_shape, dataset.kind, self.label_count, self.rng, self.device)
        size = config.training.population_size
        self.generators = Population([self.networks.individual("generator", self.coord) for _ in range(size)])
        self.discriminators = Population([self.networks.individual("discriminator", self.coord) for _ in range(size)])
        self.slots = NeighbourSlots(self.networks)
        self.mixture_weights: dict[str, float] = {str(self.coord): 1.0}
        self.score = float("nan")
        self.data = CellData(dataset, self.rng, self.device, labelled=self.conditional)
        self.training = Training(
            config.training, self.data, self.rng, self.torch_rng, config.network.latent_dim, config.precision
        )
        self._features: torch.nn.Module | None = None  # mixture.score fid: Lipizzaner's CNN, once needed

    def relocate(self, coord: Coord, topology: Topology | ClassGrid) -> None:
        """Move to another coordinate / grid (a distributed run shrank); the individuals come along."""
        label = topology.label if isinstance(topology, ClassGrid) else None
        if label != self.label:
            raise ValueError(f"cell {self.coord} trains class {self.label}; it cannot move to class {label}'s sub-grid")
        self.coord, self.topology = Coord(*coord), topology
        self.slots.clear()
        if self.config.training.data_regions:  # its neighbourhood's regions, on the new grid
            dataset = cell_dataset(self.source, self.config, self.coord, topology, self.label)
            self.data = self.training.data = CellData(dataset, self.rng, self.device, labelled=self.conditional)
        for ind in [*self.generators, *self.discriminators]:
            ind.origin = str(self.coord)

    def _noise(self, n: int) -> torch.Tensor:
        return torch.randn(n, self.config.network.latent_dim, generator=self.torch_rng, device=self.device)

    # _from_snapshot and _train stay methods, though their work is elsewhere: benchmarks/step_throughput.py
    # times a cell's phases by wrapping these names.
    def _from_snapshot(self, snapshot: Snapshot, role: Role) -> Individual:
        return self.slots.individual(snapshot, role)

    def _neighbour(self, snapshot: Snapshot, role: Role, local: Mapping[Coord, Cell]) -> Individual:
        """A neighbour's individual as its snapshot describes it. A cell of the same tile that has
        not moved since its snapshot lends its own network and Adam state (selection clones
        them, or a tile copies them into its stacks; nothing writes to them), under the snapshot's rate, fitness and loss: the same
        numbers as a slot loaded from the snapshot, without the copies. Perceptrons only: a
        DCGAN's forward moves its BatchNorm statistics, which must move in a copy."""
        header = snapshot.header
        cell = local.get(Coord(*header.cell))
        if cell is None or cell.iteration - 1 != header.iteration or cell.topology.epoch != header.epoch:
            return self._from_snapshot(snapshot, role)
        best = (cell.generators if role == "generator" else cell.discriminators).best
        if not stackable(best.network):
            return self._from_snapshot(snapshot, role)
        meta = getattr(header, role)
        return Individual(
            role, best.network, best.optimizer, meta.learning_rate, meta.fitness, meta.loss, str(cell.coord)
        )

    # ---- the iteration: its parts, which iteration.py runs in order ----------------------

    def iterate(self, neighbours: Mapping[Coord, Snapshot]) -> IterationReport:
        """Run one iteration against the given neighbour snapshots (one per neighbour at most):
        the one iteration path (iteration.py), for this cell alone."""
        return iteration.iterate([self], {self.coord: neighbours}, iteration.ONE_BY_ONE)[0]

    def select(self, neighbours: Mapping[Coord, Snapshot]) -> Selected:
        """The iteration up to training, alone: fitness over the neighbourhood, then selection."""
        return iteration.select([self], {self.coord: neighbours}, iteration.ONE_BY_ONE)[0]

    def prepare(self, neighbours: Mapping[Coord, Snapshot], local: Mapping[Coord, Cell] | None = None) -> Prepared:
        """The neighbourhood as individuals and the iteration's fitness draw: one shared draw of
        noise and real data (a conditional network's fakes take the real draw's labels: one draw
        from the priors, and pairs of one class). `local`: cells of the same tile, whose
        individuals are read in place where their snapshot is the one given (no copy)."""
        others = [Coord(*c) for c in self.topology.neighbours(self.coord) if Coord(*c) in neighbours]
        local = local or {}
        foreign_g = [self._neighbour(neighbours[c], "generator", local) for c in others]
        foreign_d = [self._neighbour(neighbours[c], "discriminator", local) for c in others]
        heard = {str(c): neighbours[c].iteration for c in others}
        all_g, all_d = [*self.generators, *foreign_g], [*self.discriminators, *foreign_d]
        return Prepared(others, foreign_g, all_g, all_d, self._fitness_draw(), heard)

    def fitness(self, prepared: Prepared) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """(fakes, generator table, discriminator table) of the neighbourhood, all against all.
        Where neighbours never enter selection (migration 0), only the cell's own individuals
        need a fitness: against every neighbour, as always."""
        draw = prepared.draw
        fakes = self._generate(prepared.all_g, draw.z, draw.labels)
        alone = not self._tournament()
        g_table, d_table = fitness_tables(
            fakes,
            [d.network for d in prepared.all_d],
            draw.real,
            self.fitness_loss,
            draw.labels,
            generators=len(self.generators) if alone else None,
            critics=len(self.discriminators) if alone else None,
        )
        return fakes, g_table, d_table

    def fitness_job(self, prepared: Prepared) -> FitnessJob:
        """What `fitness` evaluates, for a tile to evaluate with its other cells' (tile_fitness.py)."""
        alone = not self._tournament()
        return self._job(
            prepared.draw,
            prepared.all_g,
            prepared.all_d,
            generators_needed=len(self.generators) if alone else None,
            critics_needed=len(self.discriminators) if alone else None,
        )

    def _job(
        self, draw: FitnessDraw, generators: list[Individual], discriminators: list[Individual], **cut: Any
    ) -> FitnessJob:
        """These generators against these discriminators on the iteration's fitness draw."""
        networks = [g.network for g in generators], [d.network for d in discriminators]
        return FitnessJob(*networks, draw.z, draw.real, draw.labels, self.fitness_loss, **cut)

    def choose(
        self,
        prepared: Prepared,
        fakes: list[torch.Tensor],
        g_table: torch.Tensor,
        d_table: torch.Tensor,
        *,
        clone: bool = True,
    ) -> Selected:
        """Selection over the neighbourhood (or, when no one migrates this iteration, the cell
        alone) builds the new local populations, which train against each other. `clone=False`:
        the winners themselves, for a tile, whose training copies them into its stacks and hands
        back new individuals (it never writes to these)."""
        all_g, all_d = prepared.all_g, prepared.all_d
        self._assign(all_g[: len(g_table)], g_table, dim=1)
        self._assign(all_d[: d_table.shape[1]], d_table, dim=0)
        if not self.config.training.selection.enabled:
            # Lipizzaner without selection: the cell's own train, against the whole neighbourhood.
            own_g, own_d = list(self.generators), list(self.discriminators)
            new_g = [ind.clone() for ind in own_g] if clone else own_g
            new_d = [ind.clone() for ind in own_d] if clone else own_d
            frozen_g, frozen_d = prepared.foreign_g, all_d[len(own_d) :]
        else:
            new_g = self._select(all_g, len(self.generators), clone)
            new_d = self._select(all_d, len(self.discriminators), clone)
            frozen_g, frozen_d = [], []
        return Selected(
            new_g,
            new_d,
            prepared.others,
            prepared.foreign_g,
            all_d,
            prepared.draw,
            fakes,
            prepared.heard,
            frozen_g,
            frozen_d,
        )

    def _tournament(self) -> bool:
        """Whether neighbours can enter the cell's populations, so that theirs need a fitness too."""
        selection = self.config.training.selection
        return selection.enabled and selection.migration > 0

    def re_evaluate(self, selected: Selected) -> tuple[torch.Tensor, torch.Tensor]:
        """The trained individuals against the neighbourhood again: the trained generators
        against every discriminator, the trained discriminators on every first fake."""
        draw, all_d = selected.draw, selected.all_d
        new_fakes = self._generate(selected.generators, draw.z, draw.labels)
        g_table, _ = fitness_tables(
            new_fakes, [d.network for d in all_d], draw.real, self.fitness_loss, draw.labels, critics=0
        )
        _, d_table = fitness_tables(
            selected.fakes,
            [d.network for d in selected.discriminators],
            draw.real,
            self.fitness_loss,
            draw.labels,
            generators=0,
        )
        return g_table, d_table

    def re_evaluation_jobs(self, selected: Selected) -> tuple[FitnessJob, FitnessJob]:
        """What `re_evaluate` evaluates, as two jobs for a tile to batch with its other cells'."""
        trained_g = self._job(selected.draw, selected.generators, selected.all_d, critics_needed=0)
        trained_d = self._job(selected.draw, [], selected.discriminators, generators_needed=0, fakes=selected.fakes)
        return trained_g, trained_d

    def replace(self, selected: Selected, g_table: torch.Tensor, d_table: torch.Tensor) -> None:
        """The trained individuals' fitness, then the next local populations."""
        new_g, new_d = selected.generators, selected.discriminators
        self._assign(new_g, g_table, dim=1)
        self._assign(new_d, d_table, dim=0)
        for ind in [*new_g, *new_d]:
            ind.origin = str(self.coord)
        self.generators = self._replace(self.generators, new_g)
        self.discriminators = self._replace(self.discriminators, new_d)
        trained = {id(ind) for ind in [*new_g, *new_d]}
        for population in (self.generators, self.discriminators):  # a tile's survivor would keep its stack alive
            population.individuals = [i if id(i) in trained else i.owning() for i in population.individuals]

    def let_go(self) -> None:
        """The cell leaves its tile (a released slot keeps it): its individuals take storage of
        their own, so that it keeps none of the tile's stacks alive."""
        for population in (self.generators, self.discriminators):
            population.individuals = [ind.owning() for ind in population.individuals]

    def mixture_draw(self, selected: Selected) -> MixtureDraw:
        """The mixture's components (the new centre and the neighbours heard from), its weights so
        far and the samples its score is measured on. Weights persist while the neighbourhood
        does; a new one (first iteration, resize) starts from equal shares, as Lipizzaner's
        mixtures do."""
        keys = [str(c) for c in [self.coord, *selected.others]]
        if set(keys) == set(self.mixture_weights) and sum(self.mixture_weights.values()) > 0:
            weights = np.array([self.mixture_weights[k] for k in keys], dtype=np.float64)
            weights /= weights.sum()
        else:
            weights = np.full(len(keys), 1.0 / len(keys))
        generators = [self.generators.best, *selected.foreign_g]
        samples = self.config.training.mixture.score_samples
        per_component = max(2, -(-samples // len(generators)))
        z = self._noise(per_component)
        labels = self.data.sampled_labels(per_component)
        return MixtureDraw(keys, weights, generators, z, labels, self.data.random(samples)[0])

    def mixture_of(self, draw: MixtureDraw) -> MixtureScore | FrechetScore:
        """The score of any weighting of the drawn mixture against its real draw (training.mixture.score)."""
        return self._mixture_score_of(self._generate(draw.generators, draw.z, draw.labels), draw.real)

    @torch.no_grad()
    def _mixture_score_of(self, fakes: list[torch.Tensor], real: torch.Tensor) -> MixtureScore | FrechetScore:
        if self.config.training.mixture.score == "mmd":
            return MixtureScore.from_samples(fakes, real)
        # On the host: the ES weighs them with numpy weights (10 logits a sample, one read each).
        return FrechetScore.from_features([to_host(self._logits(f)) for f in fakes], to_host(self._logits(real)))

    @torch.no_grad()
    def frechet_scores(self, fakes: torch.Tensor, reals: torch.Tensor, exact: bool = True) -> list[FrechetScore]:
        """Many cells' mixtures scored as `_mixture_score_of` scores one, a tile's way: fakes
        (J, G, B, …) and reals (J, S, …) through the feature net and read back once, instead of
        1 + G reads a cell (864 at 144 cells). `exact`: one call a component and real draw, as each
        cell makes them (the same numbers); else a few fixed-size calls (a GPU's)."""
        cells, components, batch, samples = *fakes.shape[:3], reals.shape[1]
        each = fakes.reshape(cells * components, batch, -1)
        if exact:
            parts = [*each, *reals]
        else:
            parts = torch.cat([each.flatten(0, 1), reals.reshape(cells * samples, -1)]).split(FEATURE_CHUNK)
        logits = to_host(torch.cat([self._logits(part) for part in parts]))
        fake_logits = logits[: cells * components * batch].view(cells, components, batch, -1)
        real_logits = logits[cells * components * batch :].view(cells, samples, -1)
        return [FrechetScore.from_features(list(f), r) for f, r in zip(fake_logits, real_logits)]

    def _logits(self, images: torch.Tensor) -> torch.Tensor:
        """Lipizzaner's MNIST CNN's logits of generator-space images ([−1, 1] → the net's [0, 1])."""
        if self._features is None:  # loaded once a cell
            self._features = lipizzaners_mnist_cnn(self.device)
        dtype = self._features.conv1.weight.dtype  # float32, unless the default dtype was another when it loaded
        return self._features((images.reshape(-1, *IMAGE_SHAPE).to(dtype) + 1) / 2)

    def apply_mixture(self, draw: MixtureDraw, score: MixtureScore | FrechetScore) -> None:
        """The (1+1)-ES's steps on the mixture's weights, judged by `score`."""
        mixture = self.config.training.mixture
        weights, self.score = evolve_weights(draw.weights, score, mixture.sigma, mixture.es_steps, self.rng)
        self.mixture_weights = dict(zip(draw.keys, weights.tolist()))

    def conclude(self, selected: Selected, steps: Steps) -> IterationReport:
        report = _report(self, steps, selected.heard)
        self.iteration += 1
        return report

    def _fitness_draw(self) -> FitnessDraw:
        n = self.config.training.fitness.sample_size
        z = self._noise(n)
        return FitnessDraw(z, *self.data.random(n))

    def _assign(self, individuals: list[Individual], table: torch.Tensor, dim: int) -> None:
        for ind, value in zip(individuals, aggregate(table, self.config.training.fitness.mode, dim=dim).tolist()):
            ind.fitness = value

    def _select(self, candidates: list[Individual], local: int, clone: bool = True) -> list[Individual]:
        """Clones of the tournament's winners (or the winners, `clone=False`); `candidates` holds
        the `local` individuals first."""
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
        return [ind.clone() for ind in winners] if clone else list(winners)

    def _replace(self, population: Population, trained: list[Individual]) -> Population:
        training = self.config.training
        # Without selection the trained are the cell's own individuals, trained on: they go on.
        policy = training.selection.replacement if training.selection.enabled else "generational"
        return Population(
            replace(
                list(population),
                [i.fitness for i in population],
                trained,
                [i.fitness for i in trained],
                training.replacements,
                policy,
            )
        )

    @torch.no_grad()
    def _generate(
        self, generators: list[Individual], z: torch.Tensor, labels: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        return generate([g.network for g in generators], z, labels)

    def train(self, selected: Selected) -> Steps:
        """The selected train against each other (and, without selection, the neighbours' frozen copies)."""
        return self._train(selected.generators, selected.discriminators, (selected.frozen_g, selected.frozen_d))

    def _train(
        self,
        new_g: list[Individual],
        new_d: list[Individual],
        frozen: tuple[list[Individual], list[Individual]] = ([], []),
    ) -> Steps:
        return self.training.run(new_g, new_d, self.iteration, *frozen)

    def mixture_score(self, generators: list[Individual], samples: int) -> MixtureScore | FrechetScore:
        per_component = max(2, -(-samples // len(generators)))
        z = self._noise(per_component)
        fakes = self._generate(generators, z, self.data.sampled_labels(per_component))
        return self._mixture_score_of(fakes, self.data.random(samples)[0])

    def picture_labels(self, n: int) -> torch.Tensor | None:
        """Labels for a picture of n conditional samples: each class in turn, in equal blocks."""
        return self.data.picture_labels(n) if self.conditional else None

    @torch.no_grad()
    def samples(self, n: int) -> torch.Tensor:
        """n samples of the centre generator (generator space), for pictures of progress."""
        network = self.generators.best.network
        network.eval()
        try:
            return to_host(apply(network, self._noise(n), self.picture_labels(n)))
        finally:
            network.train()

    # ---- snapshots and checkpoints ---------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """What neighbours get: Adam's moments only where one may take an individual into its
        population (migration > 0); a cell without migration only evaluates and trains against them."""
        return cell_state.snapshot(self, moments=self._tournament())

    def neighbourhood_mixture(self, neighbours: Mapping[Coord, Snapshot]) -> list[tuple[str, float, Individual]]:
        """The cell's mixture components as it sees them now: (coord, weight, generator)."""
        parts = [(str(self.coord), self.generators.best)]
        for coord in self.topology.neighbours(self.coord):
            if coord in neighbours and str(coord) in self.mixture_weights:
                parts.append((str(coord), self._from_snapshot(neighbours[coord], "generator")))
        return [(key, self.mixture_weights.get(key, 0.0), ind) for key, ind in parts]

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return cell_state.state(self)

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        cell_state.restore(self, tensors, meta)

    def adopt(self, snapshot: Snapshot) -> None:
        cell_state.adopt(self, snapshot)


def _report(cell: Cell, steps: Steps, neighbours: dict[str, int]) -> IterationReport:
    return IterationReport(
        iteration=cell.iteration,
        cell=cell.coord,
        epoch=cell.topology.epoch,
        generator=_summary(cell.generators.best, steps, "generator"),
        discriminator=_summary(cell.discriminators.best, steps, "discriminator"),
        losses_used=dict(sorted(steps.losses_used.items())),
        score=cell.score,
        mixture=dict(cell.mixture_weights),
        neighbours=neighbours,
        label=cell.label,
        steps={"generator": len(steps.generator), "discriminator": len(steps.discriminator)},
    )


def _summary(best: Individual, steps: Steps, role: str) -> dict[str, float]:
    losses = getattr(steps, role)
    if steps.means is not None:  # read back already, with the rest of a tile's
        loss = steps.means[role]
    else:
        loss = scalar(stacked(losses).mean()) if len(losses) else float("nan")
    return {
        "loss": loss,
        "fitness": best.fitness,
        "learning_rate": best.learning_rate,
    }
