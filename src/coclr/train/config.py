"""Configuration of pretraining runs and of the whole CoCLR pipeline (the paper's settings by default).

Options are grouped as in a YAML file under ``configs/``::

    data:    {store: runs/ucf101_store, view: rgb, second_view: flow, length: 32, size: 128}
    model:   {width: 1.0}
    method:  {name: coclr, topk: 5, sampler_checkpoint: runs/infonce_flow/checkpoint_last.pth}
    optim:   {lr: 0.001, epochs: 100}
    run:     {out: runs/coclr_rgb, batch_size: 32}

and any option can be overridden on the command line as ``method.topk=1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from coclr.clips import ClipSettings, clip_option, feature_map_size
from coclr.config import option, require, require_learning_rate, require_milestones
from coclr.core.methods import CONTRASTIVE, MINING_SPACES, methods_help, mining_help
from coclr.data.augment import AugmentOptions
from coclr.data.views import view_kind
from coclr.errors import ConfigError, DataError
from coclr.seeding import check_seed
from coclr.store.clipstore import check_view_name
from coclr.threads import check_workers


def check_device_name(name: str, key: str) -> None:
    """The devices a training run takes (``run.device``, and the commands that start runs: ``coclr learn
    --device``): auto, cpu, cuda or cuda:N; whether it exists here is :func:`coclr.distributed.pick_device`'s."""
    require(name == "auto" or name == "cpu" or name.startswith("cuda"), key,
            f"must be auto, cpu, cuda or cuda:N, got {name!r}")


@dataclass
class DataOptions:
    store: str = option("", "clip store directory (made by `coclr data store` or `coclr data synth`)")
    split: str = option("train", "split of the store used for self-supervised training")
    view: str = option("rgb", "view trained: rgb, flow (or another stored flow view, e.g. flow_dis) or rgbdiff")
    second_view: str = option("flow", "the other view, used by coclr (mining), cmc and simultaneous training")
    length: int = clip_option("length")
    stride: int = clip_option("stride")
    size: int = clip_option("size", "side of the augmented clips (random resized crop)")
    frame_size: list[int] | None = option(None, "[height, width] every stored frame is fitted to before "
                                                "batching (default: the most common size in the split)")
    workers: int = option(4, "DataLoader worker processes per training process (0: load in the main process); "
                             "they live for the whole run")
    cache_mb: float = option(0.0, "MiB of decoded frames each training process keeps in memory after their first "
                                  "read, so later epochs skip JPEG decoding (0: none). Needs workers=0 (each worker "
                                  "process would hold a cache of its own, of the videos it happened to read); for "
                                  "splits that fit in memory")
    segment_frames: int | None = option(
        None, "cut each video into instances of this many frames (consecutive stretches of the frames data.view and, "
              "where the store holds it, data.second_view both have, the last one longer; a "
              "video shorter than two is one instance): each is a sample of every epoch, its clips drawn from it, "
              "so that a few long videos give the batches and the queue enough instances to contrast; null: each "
              "video is one instance (the paper's)")
    decode: Literal["workers", "device"] | None = option(
        None, "where stored JPEG frames are decoded: workers (in the DataLoader workers, OpenCV on the CPU) or "
              "device (the workers only read bytes; the training process decodes each batch, on a GPU with nvJPEG "
              "through torchvision, on the CPU with OpenCV); null: device on CUDA when torchvision's GPU decoder "
              "is importable and no frame cache is asked for (cache_mb), else workers")

    @property
    def clips(self) -> ClipSettings:
        return ClipSettings.of(self)

    def validate(self) -> None:
        require(bool(self.store), "store", "is required (a clip store directory)")
        for key in ("view", "second_view"):  # (the store refused it later, naming neither the key nor the file;
            try:  # and a view of no kind only once training had started, its run folder left behind)
                check_view_name(getattr(self, key))
                view_kind(getattr(self, key))
            except (DataError, ConfigError) as error:
                require(False, key, str(error))
        ClipSettings.check(self)
        check_workers(self.workers, "workers")
        require(self.cache_mb >= 0, "cache_mb", "must be non-negative")
        require(self.cache_mb == 0 or self.workers == 0, "cache_mb",
                f"needs workers=0 (got workers={self.workers}): each worker process would hold a cache of its own")
        require(self.cache_mb == 0 or self.decode != "device", "cache_mb",
                "caches decoded frames, so it cannot be used with decode=device")
        require(self.frame_size is None or (len(self.frame_size) == 2 and min(self.frame_size) > 0),
                "frame_size", "must be [height, width] with positive values")
        require(self.segment_frames is None or self.segment_frames >= 1, "segment_frames",
                "must be at least 1 (or null)")


@dataclass
class ModelOptions:
    width: float = option(1.0, "S3D channel width multiplier (1.0: the paper's S3D; 0.125: the quick CPU study's)")
    gating: bool = option(False, "use S3D-G self-gating (the paper's models do not)")
    embed_dim: int = option(128, "dimension of the L2-normalised embedding of the projection head")

    def validate(self) -> None:
        require(0 < self.width <= 4, "width", "must be in (0, 4]")
        require(self.embed_dim >= 1, "embed_dim", f"must be positive, got {self.embed_dim}")


MIN_TEMPERATURE = 1e-3
"""The lowest contrastive temperature taken, a choice: below it the logits of unit vectors pass +-1000 and the
softmax is a hard maximum, far from the paper's 0.07, long before anything overflows (float16 logits near 1.5e-5,
the loss in float32 near 1e-38, where a run trained an epoch at a loss of 3e36, then stopped at NaN)."""


@dataclass
class MethodOptions:
    name: str = option("infonce", methods_help())
    queue_size: int = option(2048, "K, number of keys in the momentum queue (2048 on UCF101, 16384 on K400); "
                             "below the number of training instances, or each clip meets its own earlier keys as "
                             "negatives")
    temperature: float = option(0.07, "softmax temperature tau")
    momentum: float = option(0.999, "EMA coefficient m of the key encoder")
    topk: int = option(5, "CoCLR: number of positives mined in the other view")
    own_drop_prob: float = option(0.9, "CoCLR: probability per iteration of dropping the own key from the "
                                       "numerator of rows that have mined positives (reference code)")
    own_positive_epochs: float = option(0.0, "CoCLR: epochs of iterations from the first optimiser step (taken "
                                             "once the queue is full) during which every row keeps its own key "
                                             "as a positive (own_drop_prob applies afterwards; 0: from the first "
                                             "step, as the reference code)")
    dropped_own_as_negative: bool = option(True, "CoCLR: a dropped own key stays in the denominator, as a "
                                                 "negative (reference code); false leaves it out of that row's loss")
    group_positives: bool = option(False, "CoCLR: also count queued clips of the same source video (UCF101: "
                                          "v_<Class>_gXX) as positives, as the reference code does")
    loss_form: Literal["auto", "mil", "supcon"] = option(
        "auto", "mil: -log of the summed softmax over positives (CoCLR); supcon: mean of the positives' "
        "log-softmax (UberNCE reference); auto: supcon for ubernce, mil otherwise")
    simultaneous: bool = option(False, "train both views at once, each mining for the other (CoCLR 'sim'); "
                                       "cmc always trains both views")
    sampler_checkpoint: str = option("", "CoCLR (alternating): checkpoint of the frozen other-view encoder "
                                         "that mines positives")
    mine_in: Literal["other", "both"] = option("other", mining_help())
    init_checkpoint: str = option("", "checkpoint to initialise the trained encoder from (its last epoch)")
    second_init_checkpoint: str = option("", "simultaneous/cmc: checkpoint initialising the second view's "
                                                "encoder")
    wait_for_full_queue: bool | None = option(None, "take no optimiser step until the queue is full (null: as the "
                                                    "reference code does, in coclr only)")

    @property
    def spec(self):
        """The method's definition (:data:`coclr.core.methods.METHODS`)."""
        return CONTRASTIVE[self.name]

    @property
    def mining_space(self):
        """Where CoCLR mines (:data:`coclr.core.methods.MINING_SPACES`)."""
        return MINING_SPACES[self.mine_in]

    @property
    def needs_sampler(self) -> bool:
        """Whether a frozen encoder of the other view (``sampler_checkpoint``) embeds the key clips to mine
        positives: alternating CoCLR."""
        return self.spec.needs_sampler(self.simultaneous)

    @property
    def mines_in_own_view(self) -> bool:
        """Whether a frozen copy of the trained view's start embeds the key clips for mining (alternating CoCLR
        with ``mine_in=both``; inert for the other methods, as ``topk``)."""
        return self.mining_space.own_view and self.needs_sampler

    @property
    def form(self) -> str:
        """The loss form after resolving ``auto``: the method's own."""
        return self.spec.loss_form if self.loss_form == "auto" else self.loss_form

    @property
    def trains_two_views(self) -> bool:
        return self.spec.trains_two_views(self.simultaneous)

    @property
    def waits(self) -> bool:
        """Whether no optimiser step is taken until the queue is full (``wait_for_full_queue`` resolved)."""
        return self.spec.waits_for_full_queue if self.wait_for_full_queue is None else self.wait_for_full_queue

    def validate(self) -> None:
        require(self.name in CONTRASTIVE, "name", f"{self.name!r} is not one of {', '.join(CONTRASTIVE)}")
        require(self.queue_size >= 1, "queue_size", f"must be positive, got {self.queue_size}")
        require(self.temperature >= MIN_TEMPERATURE, "temperature", f"must be at least {MIN_TEMPERATURE:g} (the "
                f"paper's is 0.07), got {self.temperature:g}")
        require(0 <= self.momentum < 1, "momentum", "must be in [0, 1)")
        require(self.topk >= 1, "topk", "must be at least 1")
        if self.spec.mines:  # (the other methods mine nothing: inert there)
            require(self.topk < self.queue_size, "topk", f"must be smaller than queue_size ({self.queue_size})")
        require(0 <= self.own_drop_prob <= 1, "own_drop_prob", "must be in [0, 1]")
        require(self.own_positive_epochs >= 0, "own_positive_epochs", "must be at least 0")
        require(not self.simultaneous or self.spec.two_views == "when_simultaneous", "simultaneous",
                f"applies to {', '.join(m.name for m in CONTRASTIVE.values() if m.two_views == 'when_simultaneous')} "
                "only")
        require(self.mine_in in MINING_SPACES, "mine_in", f"{self.mine_in!r} is not one of {', '.join(MINING_SPACES)}")
        if self.mining_space.own_view and self.spec.mines:  # (other methods do not mine: inert there, as topk)
            require(not self.simultaneous, "mine_in",
                    f"{self.mine_in} needs alternating coclr (simultaneous=false): a frozen other-view encoder")
            require(bool(self.init_checkpoint), "mine_in",
                    f"{self.mine_in} mines with a frozen copy of the trained view's start: set "
                    "method.init_checkpoint")


@dataclass
class OptimOptions:
    lr: float = option(1e-3, "Adam learning rate")
    weight_decay: float = option(1e-5, "Adam weight decay")
    epochs: int = option(300, "epochs (one clip pair per training video each)")
    schedule: Literal["milestones", "plateau", "constant"] = option(
        "milestones", "milestones: lr x gamma at fixed epochs (the reference code's); plateau: when the epoch loss "
        "stops falling (the paper's); constant")
    milestones: list[int] = option([], "epochs at which the lr is multiplied by gamma (schedule=milestones; none: "
                                       "a constant lr; configs/ucf101_*.yaml give the reference's)")
    gamma: float = option(0.1, "lr decay factor")
    patience: int = option(10, "schedule=plateau: epochs without improvement before decaying")
    warmup_epochs: float = option(0.0, "epochs of iterations from the run's first optimiser step (CoCLR's once "
                                  "its queue is full) over which the lr rises linearly, iteration by iteration, "
                                  "to its scheduled value (0: none). Adam's first steps "
                                  "from a fresh state move every weight by about lr, which can undo much of "
                                  "what a stage initialised from a trained encoder (CoCLR) starts from")

    def validate(self) -> None:
        require_learning_rate(self.lr, "lr")
        require(self.epochs >= 1, "epochs", f"must be at least 1, got {self.epochs}")
        require(self.warmup_epochs >= 0, "warmup_epochs", "must be non-negative")  # (at most the epochs of the
        # run, or of a pipeline's shortest stage: PretrainConfig.validate, PipelineConfig.validate)
        require(self.weight_decay >= 0, "weight_decay", "must be non-negative")
        require_milestones(self.milestones, self.epochs, "milestones", "optim.epochs", "optim.milestones=[]")
        require_read_milestones(self.milestones, self.schedule, "milestones")
        require(0 < self.gamma <= 1, "gamma", "must be in (0, 1]")
        require(self.patience >= 0, "patience", "must be non-negative")


@dataclass
class RunOptions:
    out: str = option("", "run directory (checkpoints, logs, TensorBoard events)")
    batch_size: int = option(32, "clips per training process (the global batch is this times the world size)")
    seed: int = option(0, "seed of initialisation, data order, clip sampling and augmentation")
    device: str = option("auto", "auto (cuda when available), cpu, cuda or cuda:N")
    amp: Literal["auto", "none", "bf16", "fp16"] = option(
        "auto", "mixed precision on GPU: bf16 or fp16 autocast, or none; auto: bf16 on CUDA devices that support "
                "it, none elsewhere (CPU runs are always full precision)")
    compile: bool = option(False, "torch.compile the encoders (and CoCLR's sampler)")
    channels_last: bool | None = option(None, "use the channels_last_3d memory format on GPU; null: when mixed "
                                              "precision runs on CUDA (its tensor-core convolutions use it)")
    ddp_bucket_mb: float = option(25.0, "size of DistributedDataParallel's gradient buckets in MiB (all-reduces "
                                        "start as each bucket's gradients are ready)")
    deterministic: bool = option(False, "PyTorch's deterministic algorithms (torch.use_deterministic_algorithms): "
                                        "the same result on every run where a GPU kernel would vary; a resume is "
                                        "exact without it (on a CPU, with the run's thread count and CPU kind)")
    freeze_bn: bool = option(False, "keep BatchNorm in eval mode (running statistics frozen; for tests)")
    max_steps: int = option(0, "stop after this many optimiser iterations in total (0: no limit)")
    save_every: int = option(0, "also save checkpoint_last every N iterations within an epoch (0: per epoch)")
    log_every: int = option(10, "iterations between log lines (JSON-lines and TensorBoard)")
    knn_every: int = option(0, "epochs between kNN R@1 checks on the store's labelled splits (0: never)")
    progress: bool = option(True, "show a progress bar")

    def validate(self) -> None:
        require(bool(self.out), "out", "is required (the run directory)")
        require(self.batch_size >= 1, "batch_size", "must be at least 1")
        check_seed(self.seed)
        require(self.max_steps >= 0, "max_steps", "must be non-negative")
        require(self.save_every >= 0, "save_every", "must be non-negative")
        require(self.log_every >= 1, "log_every", "must be at least 1")
        require(self.knn_every >= 0, "knn_every", "must be non-negative")
        require(self.ddp_bucket_mb > 0, "ddp_bucket_mb", f"must be positive, got {self.ddp_bucket_mb}")
        check_device_name(self.device, "device")


@dataclass
class PretrainConfig:
    """One pretraining stage: a method, a view, data, model, optimiser and run options."""

    data: DataOptions = field(default_factory=DataOptions, metadata={"help": "training data"})
    model: ModelOptions = field(default_factory=ModelOptions, metadata={"help": "encoder"})
    method: MethodOptions = field(default_factory=MethodOptions, metadata={"help": "contrastive method"})
    optim: OptimOptions = field(default_factory=OptimOptions, metadata={"help": "optimisation"})
    augment: AugmentOptions = field(default_factory=AugmentOptions, metadata={"help": "augmentation (the data's own "
                                                                                      "options: coclr.data.augment)"})
    run: RunOptions = field(default_factory=RunOptions, metadata={"help": "run"})

    def validate(self) -> None:
        """What holds across sections, checked after each section's own rules: the second view where the method
        reads one (InfoNCE and UberNCE read one view: the second is inert there), the frozen miner of alternating
        CoCLR."""
        if self.method.spec.other_view is not None:
            self.check_second_view(f"{self.method.name} reads both")
        require(self.optim.warmup_epochs <= self.optim.epochs, "optim.warmup_epochs",
                f"must lie in 0..optim.epochs ({self.optim.epochs})")
        method = self.method
        if method.needs_sampler:
            require(bool(method.sampler_checkpoint), "method.sampler_checkpoint",
                    f"{method.name} needs the frozen other-view encoder that mines positives (a checkpoint of "
                    "the second view), or method.simultaneous=true")
        # a checkpoint the method never reads was ignored without a word (a flow start believed used)
        named = f"{method.name}{' simultaneous' if method.simultaneous else ''}"
        require(not method.sampler_checkpoint or method.needs_sampler,
                "method.sampler_checkpoint", "is read by alternating coclr only (name=coclr, simultaneous=false), "
                f"which mines with a frozen encoder of the other view; {named} reads none: leave it empty")
        require(not method.second_init_checkpoint or method.trains_two_views, "method.second_init_checkpoint",
                "starts the second view's encoder where both views train (cmc, or coclr with simultaneous=true); "
                f"{named} trains one: leave it empty, or give method.init_checkpoint for the view it trains")

        data = self.data
        positions = math.prod(feature_map_size(data.length, data.size, data.size))
        if self.run.batch_size * positions < 2:
            length = next(n for n in range(data.length, 99) if math.prod(feature_map_size(n, data.size, data.size)) > 1)
            size = next(n for n in range(data.size, 999) if math.prod(feature_map_size(data.length, n, n)) > 1)
            require(False, "run.batch_size",
                    f"{self.run.batch_size}: batch-norm in training needs two values per channel, and clips of "
                    f"{data.length}x{data.size}x{data.size} leave one position in S3D's last feature map; give "
                    f"run.batch_size of at least 2, or data.length of at least {length} or data.size of at least "
                    f"{size}")

    def check_second_view(self, why: str) -> None:
        require(self.data.view != self.data.second_view, "data.second_view",
                f"must differ from data.view ({self.data.view!r}): {why}")

    @property
    def views(self) -> list[str]:
        """Views each sample must provide: the trained view, plus the second view when the method uses it."""
        uses_second = self.method.spec.other_view is not None
        return [self.data.view, self.data.second_view] if uses_second else [self.data.view]


@dataclass
class PipelineOptions:
    cycles: int = option(2, "CoCLR cycles after the InfoNCE initialisation (each trains view 1, then view 2)")
    infonce_epochs: int = option(300, "epochs of the InfoNCE initialisation of each view")
    cycle_epochs: int = option(100, "epochs of each half-cycle (one view trained, the other frozen)")
    mode: Literal["alternate", "sim"] = option("alternate", "alternate (the paper) or sim (both views at once, "
                                                            "cycle_epochs x 2 per cycle)")
    infonce_milestones: list[int] = option([], "lr milestones of the InfoNCE stages (none: a constant lr; the "
                                               "reference's [200, 250] of 300 epochs are in configs/)")
    cycle_milestones: list[int] = option([], "lr milestones of each CoCLR stage (none: a constant lr; the "
                                             "reference's [80] of 100 epochs are in configs/)")
    cycle_lr: float | None = option(None, "lr of the CoCLR stages, which start from trained encoders (null: "
                                    "optim.lr, as in the paper and the reference code)")
    infonce_from: str = option("", "another pipeline folder whose finished InfoNCE stages start this one's cycles "
                                   "(this pipeline then trains no InfoNCE stage: ablations share one initialisation)")
    init: str | None = option(None, "a checkpoint that starts the first view's (data.view) InfoNCE stage instead of "
                                    "random weights (null: from scratch)")
    second_init: str | None = option(None, "a checkpoint that starts the second view's (data.second_view) InfoNCE "
                                           "stage (null: from scratch)")
    miner: str | None = option(None, "a fixed checkpoint of the first view (data.view) whose space mines the "
                               "positives of every CoCLR stage of the second view (null: the first view's latest "
                               "encoder, as in the paper); the first view's CoCLR stages are then not trained")

    def validate(self) -> None:
        require(self.cycles >= 0, "cycles", "must be non-negative")
        if self.cycle_lr is not None:
            require_learning_rate(self.cycle_lr, "cycle_lr")
        require(self.infonce_epochs >= 1, "infonce_epochs", "must be at least 1")
        require(self.cycle_epochs >= 1, "cycle_epochs", "must be at least 1")
        for key in ("init", "second_init", "miner"):
            require(getattr(self, key) is None or bool(getattr(self, key)), key, "must name a checkpoint (or be null)")
        require(not (self.infonce_from and (self.init or self.second_init)), "init",
                "starts an InfoNCE stage, and with infonce_from this pipeline trains none: set one of them")
        require(self.miner is None or self.mode == "alternate", "miner", "needs mode=alternate (in sim both views "
                "are trained and each mines for the other)")
        for key, epochs in (("infonce_milestones", "infonce_epochs"), ("cycle_milestones", "cycle_epochs")):
            require_milestones(getattr(self, key), getattr(self, epochs), key, f"pipeline.{epochs}",
                               f"pipeline.{key}=[]")


@dataclass
class PipelineConfig(PretrainConfig):
    """The paper's algorithm: InfoNCE on both views, then ``cycles`` of alternating CoCLR.

    The sections shared with :class:`PretrainConfig` apply to every stage (``method.name``, the checkpoints,
    ``optim.epochs`` and ``run.out`` are set per stage; ``run.out`` is the pipeline folder).
    """

    pipeline: PipelineOptions = field(default_factory=PipelineOptions, metadata={"help": "schedule"})

    @staticmethod
    def refuse_given(given: dict[str, Any]) -> None:
        """Refuse the options each stage sets (:data:`PER_STAGE`) where they are given at all, whatever their value
        (:func:`coclr.config.load_config`: ``optim.epochs=300``, the default, was dropped without a word)."""
        for key in PER_STAGE:
            section, name = key.split(".")
            require(not (isinstance(given.get(section), dict) and name in given[section]), key, per_stage(key))

    def stage_epochs(self) -> dict[str, int]:
        """The epochs of each kind of stage the pipeline trains, by the option that sets them (none of a kind it
        does not train: InfoNCE stages taken from ``infonce_from``, cycles of 0)."""
        schedule = self.pipeline
        epochs = {} if schedule.infonce_from else {"pipeline.infonce_epochs": schedule.infonce_epochs}
        if schedule.cycles:
            epochs["pipeline.cycle_epochs"] = schedule.cycle_epochs * (2 if schedule.mode == "sim" else 1)
        return epochs

    def validate_first(self) -> None:
        """Before the sections' rules (``method.simultaneous`` was refused as "applies to coclr only"); a value
        given otherwise than from a file or the command line (:meth:`refuse_given`), where it differs."""
        defaults = PretrainConfig()
        for key in PER_STAGE:
            section, name = key.split(".")
            require(getattr(getattr(self, section), name) == getattr(getattr(defaults, section), name), key,
                    per_stage(key))

    def validate(self) -> None:
        self.check_second_view("a pipeline trains both")
        stages = self.stage_epochs()
        if stages:  # (checked against optim.epochs, which a pipeline never reads: 300 refused a warm-up of 350 in
            shortest = min(stages, key=stages.get)  # stages of 400, and one longer than a stage was cut silently)
            require(self.optim.warmup_epochs <= stages[shortest], "optim.warmup_epochs",
                    f"must lie in 0..{stages[shortest]}, the epochs of the pipeline's shortest stages "
                    f"({shortest}): it counts within each stage")
        for key in ("infonce_milestones", "cycle_milestones"):  # (each stage's optim.milestones)
            require_read_milestones(getattr(self.pipeline, key), self.optim.schedule, f"pipeline.{key}")
        require(not self.method.mining_space.own_view or self.pipeline.mode == "alternate", "method.mine_in",
                f"{self.method.mine_in} needs pipeline.mode=alternate (a frozen other-view encoder mines)")


PER_STAGE = {"method.name": "pipeline.mode (the stages' methods are InfoNCE, then CoCLR: coclr pretrain trains one "
                            "method)",
             "method.simultaneous": "pipeline.mode=sim",
             "method.init_checkpoint": "pipeline.init", "method.second_init_checkpoint": "pipeline.second_init",
             "method.sampler_checkpoint": "pipeline.miner",
             "optim.epochs": "pipeline.infonce_epochs and pipeline.cycle_epochs",
             "optim.milestones": "pipeline.infonce_milestones and pipeline.cycle_milestones"}
"""The pretraining options a pipeline sets for each of its stages (:func:`coclr.train.pipeline.stage_config`),
and the pipeline's option to give instead: a value given for one would be dropped."""


def per_stage(key: str) -> str:
    """Why a pipeline refuses the option ``key`` of :data:`PER_STAGE`, and what to give instead."""
    return f"is set by each stage of a pipeline: give {PER_STAGE[key]} (in coclr study: its schedule.* options)"


def require_read_milestones(milestones: list[int], schedule: str, key: str) -> None:
    """Refuse lr ``milestones`` (option ``key``) under a ``schedule`` that never reads them (the lr stayed as it was,
    without a word)."""
    require(not milestones or schedule == "milestones", key,
            f"{milestones} are read only with optim.schedule=milestones (given {schedule}): leave them out, or give "
            "optim.schedule=milestones")
