"""Pydantic models of an experiment. Defaults live here and nowhere else."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

Beta = Annotated[float, Field(ge=0, lt=1)]  # an Adam β: 1 or more never forgets, and diverges
LossName = Literal["minimax", "nonsaturating", "mse", "wgan_gp"]
# Old loss names, refused with the new ones: Palomino's "bce" was the saturating game, though
# Lipizzaner's BCE is the non-saturating one.
RENAMED_LOSSES = {
    "bce": "use 'nonsaturating' (what Lipizzaner calls BCE) or 'minimax' (the saturating form 'bce' was here)",
    "heuristic": "use 'nonsaturating'",
}


def renamed_loss(name: str) -> str:
    return f"loss {name!r} was renamed: {RENAMED_LOSSES[name]}"


DataName = Literal["mnist", "fashion_mnist", "cifar10", "image_folder", "gaussian_ring", "gaussian_grid"]
MetricName = Literal["fid", "is", "kid", "tvd", "modes", "memorization"]
# Labels of each dataset whose label count is known without reading it (image_folder: one per
# subfolder). Partitioned layouts need it torch-free (the orchestrator); tests/test_partitioned.py
# checks it against the loaders.
LABEL_COUNTS: dict[str, int] = {
    "mnist": 10,
    "fashion_mnist": 10,
    "cifar10": 10,
    "gaussian_ring": 8,
    "gaussian_grid": 25,
}


class _Strict(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class _QuietNewKeys(_Strict):
    """Keys added later (`_quiet`) are left out of a dump while at their default: the config.yaml
    (and mixture.json) of a run that does not use them reads exactly as before."""

    _quiet: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _leave_out_quiet_defaults(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for name in self._quiet:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data


class GridConfig(_QuietNewKeys):
    rows: int = Field(
        3,
        ge=1,
        le=1024,
        description="rows of the torus",
        json_schema_extra={"cost": "the cells are workers: the grid is bounded by who runs it"},
    )
    cols: int = Field(3, ge=1, le=1024, description="columns of the torus")
    neighbourhood: Literal["von_neumann", "moore", "none"] = Field(
        "von_neumann",
        description="von_neumann: N, S, W, E; moore: the 8 around (fewer on small grids, where offsets coincide); "
        "none: no neighbours, each cell alone with the same policies (the referee's 'no communication' ablation)",
    )
    per_class: str = Field(
        "1x1",
        description="with data.partition: labels, each class's sub-grid, RxC; the grid is then classes·R × C "
        "(leave grid.rows and grid.cols out) — see partitioned.md",
    )
    _quiet: ClassVar[tuple[str, ...]] = ("per_class",)

    @field_validator("per_class")
    @classmethod
    def _per_class(cls, value: str) -> str:
        rows, sep, cols = str(value).lower().replace("×", "x").partition("x")
        if not sep or not rows.strip().isdigit() or not cols.strip().isdigit() or int(rows) < 1 or int(cols) < 1:
            raise ValueError("expected ROWSxCOLS with both ≥ 1, e.g. 1x1 or 2x2")
        return f"{int(rows)}x{int(cols)}"

    @property
    def per_class_shape(self) -> tuple[int, int]:
        rows, _, cols = self.per_class.partition("x")
        return int(rows), int(cols)


class FitnessConfig(_Strict):
    sample_size: int = Field(
        100,
        ge=1,
        le=100_000,
        description="samples each generator–discriminator pair is evaluated on",
        json_schema_extra={"cost": "samples held at once for evaluation"},
    )
    mode: Literal["average", "best", "worst"] = Field(
        "average",
        description="an individual's fitness: the average, best or worst of its losses against the neighbourhood",
    )


class MixtureConfig(_QuietNewKeys):
    sigma: float = Field(0.01, gt=0, le=10, description="std of the (1+1)-ES Gaussian step on mixture weights")
    score_samples: int = Field(
        256, ge=10, le=100_000, description="samples drawn per iteration for the in-cell mixture score"
    )
    es_steps: int = Field(1, ge=0, le=10_000, description="(1+1)-ES proposals on the mixture weights per iteration")
    score: Literal["mmd", "fid"] = Field(
        "mmd",
        description="the in-cell mixture score the ES minimises. mmd: kernel MMD² against real samples, on pixels; "
        "fid (Lipizzaner): the Fréchet distance on Lipizzaner's MNIST CNN's 10 logits (its own weights, bundled), "
        "for 28×28 grey images (mnist, fashion_mnist)",
    )
    _quiet: ClassVar[tuple[str, ...]] = ("score",)


class MutationConfig(_QuietNewKeys):
    probability: float = Field(0.5, ge=0, le=1, description="chance a learning rate mutates at a step")
    alpha: float = Field(0.0001, ge=0, le=1, description="learning-rate step: lr += alpha · N(−lr₀/10, lr₀)")
    reaches_optimizer: bool = Field(
        True,
        description="false: Lipizzaner's effect — the mutation is drawn (the random stream as with it) but Adam keeps "
        "the rate it started with, as Lipizzaner's optimiser, rebuilt from its saved state each batch, does",
    )
    _quiet: ClassVar[tuple[str, ...]] = ("reaches_optimizer",)


class EnsembleConfig(_QuietNewKeys):
    """The run's result: a mixture over every cell's generator, optimised after training."""

    scope: Literal["grid", "neighbourhood"] = Field(
        "grid",
        description="the run's result. grid: a mixture over every cell's generator, optimised after training (greedy "
        "forward selection with removal, then a (1+1)-ES); neighbourhood: the best cell's neighbourhood mixture. "
        "Conditional and partitioned runs use neighbourhood",
    )
    es_steps: int = Field(200, ge=0, le=100_000, description="(1+1)-ES steps on the weights after greedy selection")
    sigma: float = Field(0.02, gt=0, le=10, description="std of the ES's Gaussian step on the weights")
    samples: int = Field(
        0, ge=0, le=100_000, description="generated samples per cell; 0 = about 5,000 points or 2,000 images in all"
    )
    critic_quantile: float = Field(
        0.0,
        ge=0,
        le=0.5,
        description="sample the grid's ensemble through the cells' discriminators: keep a generated sample when their "
        "mean logit is at least that of this quantile of real data (0.05: the critics would reject 5 % of real data); "
        "0 = off. See engine.md, 'Sampling through the discriminators'",
    )
    critic: Literal["mean", "own"] = Field(
        "mean",
        description="with critic_quantile: mean = every sample judged by all the cells' discriminators together, "
        "calibrated on all the data; own = each cell's samples by its own discriminator, calibrated on its own "
        "data (for training.data_regions, where a discriminator knows only its region)",
    )
    _quiet: ClassVar[tuple[str, ...]] = ("critic",)


class SelectionConfig(_QuietNewKeys):
    """How neighbours' individuals enter a cell (see docs/engine.md, 'Diversity')."""

    enabled: bool = Field(
        True,
        description="false: Lipizzaner's enable_selection off — no tournament and no replacement; the cell's own "
        "individuals train, each batch against an opponent drawn from the whole neighbourhood (the neighbours' "
        "copies frozen); docs/lipizzaner.md",
    )

    migration: float = Field(
        1.0,
        ge=0,
        le=1,
        description="chance per iteration that the neighbours' individuals enter the tournament (1 = always, as in "
        "Lipizzaner); otherwise the cell selects among its own, which keeps lineages apart",
    )
    margin: float = Field(
        0.0,
        ge=0,
        le=1_000,
        description="a neighbour's individual counts this much worse in the tournament: it replaces the cell's own "
        "lineage only when clearly fitter",
    )
    replacement: Literal["elitist", "generational", "if_fitter"] = Field(
        "elitist",
        description="elitist: the `replacements` worst local individuals give way to the best trained ones; "
        "generational ((μ,λ)): the trained offspring replace the whole local population; if_fitter (Lipizzaner): "
        "as elitist, but a worst local individual gives way only to a strictly fitter trained one",
    )
    opponents: Literal["per_member", "per_batch"] = Field(
        "per_member",
        description="per_member: each trained individual draws its own opponent each batch; per_batch "
        "(Lipizzaner): one opponent a batch, shared by every individual of the role",
    )
    _quiet: ClassVar[tuple[str, ...]] = ("enabled", "opponents")


class DecayConfig(_Strict):
    """Linear decay of every optimiser's step size over the run's last iterations: a large step
    finds the modes, a small one sharpens them (an individual's own, mutated rate is kept and scaled)."""

    start: float = Field(
        1.0, ge=0, le=1, description="share of training.iterations after which the step size decays; 1 = never"
    )
    final: float = Field(1.0, gt=0, le=1, description="the step size's multiplier in the last iteration")


class TrainingConfig(_Strict):
    iterations: int = Field(50, ge=1, le=10_000_000, description="iterations per cell")
    batch_size: int = Field(
        100,
        ge=1,
        le=65_536,
        description="samples per training batch",
        json_schema_extra={"cost": "a batch of 64×64×3 images at the limit is 3.2 GB of float32 per cell"},
    )
    batches_per_iteration: int = Field(
        0, ge=0, le=1_000_000, description="batches per iteration; 0 = one pass over the cell's data"
    )
    population_size: int = Field(
        1,
        ge=1,
        le=64,
        description="local generators and discriminators per cell",
        json_schema_extra={"cost": "each individual is one generator and one discriminator in memory"},
    )
    tournament_size: int = Field(2, ge=1, le=64, description="individuals drawn into each selection tournament")
    replacements: int = Field(
        1, ge=0, le=64, description="worst local individuals replaced by the best trained ones each iteration"
    )
    learning_rate: float = Field(
        0.0002, gt=0, le=1, description="initial Adam learning rate (each individual then carries its own)"
    )
    adam_betas: tuple[Beta, Beta] = Field((0.5, 0.999), description="Adam's β₁ and β₂")
    decay: DecayConfig = Field(default_factory=DecayConfig)
    losses: list[LossName] = Field(
        default_factory=lambda: ["nonsaturating"],
        min_length=1,
        max_length=8,
        description="drawn per step (Mustangs). nonsaturating: G maximises log D(G(z)), what Lipizzaner calls BCE; "
        "minimax: Goodfellow's saturating form; mse; wgan_gp. The first is also the fitness loss; the old names "
        "bce and heuristic are refused with the new ones",
    )
    n_critic: int = Field(5, ge=1, le=100, description="with wgan_gp: discriminator steps per generator step")
    discriminator_skip_each_nth_step: int = Field(
        0, ge=0, le=1_000, description="k > 0: the discriminator steps only on every (k+1)-th batch"
    )
    data_diet: float = Field(
        1.0,
        gt=0,
        le=1,
        description="share of the data each cell trains on: its own seeded random subset (data dieting, Toutouh et al. 2020)",
    )
    data_regions: bool = Field(
        False,
        description="each cell trains on its own region of the data: one k-means cluster per cell (seeded, the same "
        "in every process), so each generator has a few modes to learn; the whole-grid ensemble joins them "
        "(docs/engine.md)",
    )
    fitness: FitnessConfig = Field(default_factory=FitnessConfig)
    mixture: MixtureConfig = Field(default_factory=MixtureConfig)
    mutation: MutationConfig = Field(default_factory=MutationConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    ensemble: EnsembleConfig = Field(default_factory=EnsembleConfig)
    checkpoint_every: int = Field(
        10, ge=0, le=10_000_000, description="iterations between checkpoints; 0 = only at the end (and on Ctrl-C)"
    )
    checkpoint_keep: int = Field(3, ge=1, le=100, description="checkpoints kept on disk per cell")
    sample_every: int = Field(
        10, ge=0, le=10_000_000, description="iterations between sample pictures; 0 = only at the end"
    )
    synchronous: bool = Field(
        False, description="every cell waits for its neighbours' iteration i−1: reproducible runs"
    )

    @field_validator("losses", mode="before")
    @classmethod
    def _renamed(cls, value: Any) -> Any:
        for name in value if isinstance(value, list) else []:
            if name in RENAMED_LOSSES:
                raise ValueError(renamed_loss(name))
        return value

    @model_validator(mode="after")
    def _tournament_fits(self) -> TrainingConfig:
        if self.replacements > self.population_size:
            raise ValueError("training.replacements must be ≤ training.population_size")
        return self


class DataConfig(_QuietNewKeys):
    name: DataName = Field("gaussian_ring", description="the dataset")
    dir: Path | None = Field(
        None,
        description="where its files are; none: `$PALOMINO_DATA_DIR/<name>` if that is set, else the user "
        "cache's `palomino/<name>` (`~/.cache/palomino/<name>` on Linux; Fashion-MNIST: then Debian's `/usr/share/datasets/fashion-mnist`)",
    )
    split: Literal["train", "test"] = Field("train", description="which split of the dataset")
    size: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="keep this many samples (seeded); 0 = all (toys: 10,000 points)",
        json_schema_extra={"cost": "samples in memory per cell (MNIST at the limit: 31 GB)"},
    )
    image_size: int | None = Field(
        None,
        ge=8,
        le=1024,
        description="image_folder: square size in pixels (none: 64)",
        json_schema_extra={"cost": "one 1024×1024×3 float32 image is 12.6 MB: keep data.size small with it"},
    )
    channels: Literal[1, 3] | None = Field(None, description="image_folder: 1 or 3 channels (none: 1)")
    download: bool = Field(
        False,
        description="download MNIST / Fashion-MNIST / CIFAR-10 into that folder when absent; off: a missing file is an "
        "error that says what goes where",
    )
    classes: list[int] | None = Field(
        None,
        min_length=1,
        max_length=1_000,
        description="keep only these labels, e.g. [0, 1, 7]; data.size then counts samples of these classes",
    )
    partition: Literal["none", "labels"] = Field(
        "none",
        description="labels: one sub-grid per class (grid.per_class), each cell training on its class only; the "
        "result is the class mixture Σ_c p(c) p(x | c) (partitioned.md); image_folder needs data.classes listed",
    )
    _quiet: ClassVar[tuple[str, ...]] = ("classes", "partition")

    @field_validator("classes")
    @classmethod
    def _classes(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if any(label < 0 for label in value):
            raise ValueError(f"labels are ≥ 0 (got {value})")
        if len(set(value)) != len(value):
            raise ValueError(f"each label at most once (got {value})")
        return sorted(value)

    @model_validator(mode="after")
    def _labels_known(self) -> DataConfig:
        count = LABEL_COUNTS.get(self.name)
        if self.classes is not None and count is not None and max(self.classes) >= count:
            raise ValueError(f"data.classes: {self.name} has labels 0–{count - 1}, not {max(self.classes)}")
        if self.partition == "labels" and self.labels is None:
            raise ValueError(
                f"data.classes: data.partition=labels on {self.name} needs the labels listed, e.g. [0, 1, 2]"
            )
        return self

    @property
    def labels(self) -> tuple[int, ...] | None:
        """The labels a run uses: data.classes, else all of a dataset whose count is known (else None)."""
        if self.classes is not None:
            return tuple(self.classes)
        count = LABEL_COUNTS.get(self.name)
        return tuple(range(count)) if count is not None else None


class NetworkConfig(_QuietNewKeys):
    name: Literal["mlp", "dcgan", "sngan"] = Field(
        "mlp",
        description="mlp: Lipizzaner's perceptron; dcgan: 28, 32 or 64 px; sngan: a DCGAN with a spectral-norm discriminator",
    )
    latent_dim: int = Field(64, ge=1, le=4_096, description="size of the generator's noise vector z")
    hidden: int = Field(
        256,
        ge=1,
        le=16_384,
        description="mlp: hidden width",
        json_schema_extra={"cost": "an mlp layer of 16,384² weights is 1 GB"},
    )
    width: int = Field(64, ge=1, le=1_024, description="dcgan and sngan: base channel count")
    conditional: bool = Field(
        False,
        description="a conditional GAN (CGAN, DC-CGAN): a label embedding joined to z and to D's input; "
        "not with data.partition: labels",
    )
    label_dim: int = Field(
        16,
        ge=1,
        le=1_024,
        description="size of the label embedding given to a conditional generator (and mlp discriminator; "
        "dcgan and sngan discriminators take it as one extra image plane)",
    )
    activation: Literal["auto", "leaky_relu", "tanh", "relu"] = Field(
        "auto",
        description="mlp hidden layers (leaky_relu with slope 0.2); auto: tanh for 2-D points (Lipizzaner's ring "
        "network; LeakyReLU lets one lineage collapse the toys), leaky_relu for images",
    )
    minibatch_std: bool = Field(
        False,
        description="mlp: the discriminator also sees how much its batch varies (ProGAN's minibatch "
        "standard deviation), so a generator that drops one of its modes is caught",
    )
    _quiet: ClassVar[tuple[str, ...]] = ("conditional", "label_dim", "activation", "minibatch_std")

    @model_validator(mode="after")
    def _spread_on_mlp(self) -> NetworkConfig:
        if self.minibatch_std and self.name != "mlp":
            raise ValueError(
                f"minibatch_std is for the mlp discriminator only (name is {self.name}): drop it or use name: mlp"
            )
        return self


class DistributedConfig(_Strict):
    """How the orchestrator lays out and keeps a distributed run (ignored by `palomino train`)."""

    min_cells: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="distributed runs: fewest cells (of the laid-out rectangle) to start with or go on with after "
        "failures; none: max_cells",
    )
    max_cells: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="most cells laid out; surplus workers are spares (palomino up sets it to --cells); none: rows×cols",
    )
    start_timeout: float = Field(
        120.0, gt=0, le=86_400, description="seconds to wait for max_cells workers before starting with fewer"
    )
    on_failure: Literal["auto", "replace", "shrink"] = Field(
        "auto",
        description="replace: a spare takes the dead cell's coordinate from its newest checkpoint, or its newest "
        "published snapshot when newer (without a spare the grid shrinks); shrink: the survivors are laid out "
        "again; auto: replace while spares last",
    )
    heartbeat_ttl: float = Field(
        5.0,
        ge=2,
        le=3_600,
        description="seconds without a heartbeat before a worker counts as dead (≥ 2: cells heartbeat every second; "
        "a worker goes back to 5 s between assignments)",
    )
    neighbour_timeout: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="seconds a cell waits for its neighbours' snapshots (all of them together) before going on without the silent ones",
    )
    max_snapshot_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="snapshot bodies above this are refused and dead-lettered",
        json_schema_extra={"cost": "per message on the broker (RabbitMQ's own limit is lower by default)"},
    )


SCORE_SAMPLES = {"image": 10_000, "points": 2_500}  # generated samples per scored mixture, when not given
REAL_SCORE_SAMPLES = 10_000  # real images behind a scoring's real statistics, when not given


class MixtureScoring(_Strict):
    """What a scoring computes: an experiment's `scoring:` section and the scorer's options share it."""

    metrics: list[MetricName] | None = Field(
        None,
        min_length=1,
        max_length=6,
        description="none: fid, is, kid, tvd, memorization for images; modes for the toys",
    )
    samples: int | None = Field(
        None,
        ge=2,
        le=1_000_000,
        description=f"generated samples per mixture; none: {SCORE_SAMPLES['image']:,} images or "
        f"{SCORE_SAMPLES['points']:,} points",
        json_schema_extra={"cost": "generated samples per scored mixture"},
    )
    extractor: Literal["classifier", "lipizzaner", "inception"] = Field(
        "classifier",
        description="classifier: a file of palomino classifier train (either architecture); lipizzaner: "
        "Lipizzaner's MNIST CNN, its own trained weights (bundled) unless a classifier file of it is given "
        "(--arch lipizzaner or classifier import), its 10 logits the features, so FIDs "
        "compare with Lipizzaner's published ones; inception: Inception-v3 weights by path",
    )
    classifier: Path | None = Field(None, description="the classifier file; none: $PALOMINO_CLASSIFIER")


class ScoringConfig(MixtureScoring):
    """What the offline scorer computes (`palomino score`, the scorer service); see docs/scoring.md."""

    every: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="distributed runs: every this many iterations each cell queues its neighbourhood mixture for the "
        "scorers (under periodic in scores.json, and as score events); 0 = only at the end (scoring.md). Embedded "
        "runs warn and score nothing during training",
    )
    final: bool = Field(
        True, description="distributed runs: queue score jobs for the final mixtures (for `palomino scorer`)"
    )

    def job_options(self) -> dict[str, Any]:
        """What a score job carries as its options (the rest is the scorer's defaults and environment)."""
        return self.model_dump(mode="json", include=set(MixtureScoring.model_fields), exclude_none=True)


class ExperimentConfig(_Strict):
    name: str = Field(
        "experiment",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="prefix of the run directory's name (<name>-<UTC time>-<4 hex>)",
    )
    seed: int = Field(
        0, ge=0, le=2**63 - 1, description="seeds every cell (SeedSequence([seed, row, col])), the toys and subsetting"
    )
    device: str = Field("cpu", description="cpu or cuda[:N]")
    tiles: Literal["auto", "on", "off"] = Field(
        "auto",
        description="train a process's cells in lockstep as one tile, weights stacked (docs/tiles.md): auto = "
        "where it pays (every network on a GPU; small mlp on a CPU), on = always, off = one cell at a time",
    )
    compile: Literal["auto", "on", "graphs", "off"] = Field(
        "auto",
        description="a tile's training batch through torch.compile (docs/speed.md): auto = perceptrons on a GPU "
        "only (on a CPU compiling cost more than it saved; DCGAN/SNGAN stay eager until timed on a GPU), on, "
        "graphs (on, its steps replayed as CUDA graphs: a CUDA device only), off; compiled and eager agree to "
        "float rounding",
    )
    precision: Literal["float32", "tf32", "bf16"] = Field(
        "float32",
        description="the training steps' matrix products: float32; tf32 (CUDA's tensor cores, float32 storage); "
        "bf16 (autocast; weights and Adam stay float32)",
    )
    grid: GridConfig = Field(default_factory=GridConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value != "cpu" and not value.startswith("cuda"):
            raise ValueError("device must be 'cpu' or 'cuda[:N]'")
        return value

    @field_validator("tiles", "compile", mode="before")
    @classmethod
    def _tiles_word(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare on/off as true/false: take them as the words they were.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _tf32_on_cuda(self) -> ExperimentConfig:
        if self.precision == "tf32" and not self.device.startswith("cuda"):
            raise ValueError(
                f"precision: tf32 is a mode of CUDA's tensor cores, and device is {self.device}; "
                "use float32 or bf16 there, or device: cuda"
            )
        if self.compile == "graphs" and not self.device.startswith("cuda"):
            raise ValueError(
                f"compile: graphs replays CUDA graphs, and device is {self.device}; use compile: on there, or device: cuda"
            )
        return self

    @model_validator(mode="after")
    def _fid_on_digits(self) -> ExperimentConfig:
        if self.training.mixture.score == "fid" and self.data.name not in ("mnist", "fashion_mnist"):
            raise ValueError(
                f"training.mixture.score: fid scores through Lipizzaner's MNIST CNN, which takes 28×28 grey images "
                f"(mnist, fashion_mnist), not {self.data.name}; use score: mmd"
            )
        return self

    @model_validator(mode="after")
    def _labels_fit(self) -> ExperimentConfig:
        data = self.data
        if data.partition != "labels":
            return self
        if self.network.conditional:
            raise ValueError(
                "network.conditional: a partitioned run trains each class on its own sub-grid, so a "
                "conditional network would only ever see one label; use data.partition=none or conditional=false"
            )
        assert data.labels is not None  # DataConfig checked it
        # A partitioned grid's cell ids: class k's sub-grid takes rows k·R … k·R+R−1 (palomino.grid.partition).
        per_rows, per_cols = self.grid.per_class_shape
        extent = (len(data.labels) * per_rows, per_cols)
        given = (self.grid.rows, self.grid.cols)
        if {"rows", "cols"} & self.grid.model_fields_set and given != extent:
            raise ValueError(
                f"grid.rows: a partitioned run's grid is classes × grid.per_class = {extent[0]}×{extent[1]} "
                f"(got {given[0]}×{given[1]}); leave grid.rows and grid.cols out and set grid.per_class"
            )
        if given != extent:
            self.grid.rows, self.grid.cols = extent
        return self

    @property
    def partitioned(self) -> bool:
        return self.data.partition == "labels"

    @property
    def grid_ensemble(self) -> bool:
        """Whether the result is the whole grid's ensemble (palomino.runs.grid_ensemble): training.ensemble.scope
        grid, except where one mixture cannot hold every cell — conditional and partitioned runs."""
        return self.training.ensemble.scope == "grid" and not self.network.conditional and not self.partitioned

    @property
    def cells(self) -> int:
        return self.grid.rows * self.grid.cols

    @property
    def cell_bounds(self) -> tuple[int, int]:
        """(min_cells, max_cells) of a distributed run, defaults filled in."""
        high = self.distributed.max_cells or self.cells
        low = min(self.distributed.min_cells or high, high)
        return low, high
