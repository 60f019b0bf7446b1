"""What a study runs: the rows and columns of the paper's Table 1, the data, the training recipe and the evaluation.

The defaults are the quick study on the built-in synthetic data, sized for a laptop CPU (``coclr demo``): six
rows, linear probe and retrieval. ``configs/study_demo.yaml`` asks for every row and column on the same data;
``configs/study_ucf101.yaml`` sets the paper's recipe on UCF101 split 1. Every option is checked before any work
(:func:`coclr.study.plan.plan_study` also builds every stage's configuration and checks every path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from coclr.clips import JPEG_QUALITY, SHORT_SIDE, check_short_side
from coclr.config import option, require, require_learning_rate
from coclr.core.methods import METHODS
from coclr.flow.backends import BACKENDS
from coclr.flow.encode import check_bound
from coclr.seeding import check_seed
from coclr.threads import check_workers
from coclr.train.recipes import STUDY_TRAIN

# ------------------------------------------------------------------------------------------------- the rows


@dataclass(frozen=True)
class Row:
    """One row of Table 1: how it is named, which encoders it evaluates and the paper's numbers.

    ``method_name``: its row of :data:`coclr.core.methods.METHODS` (``method``, its Table 1 name with the variant,
    and ``labels`` follow from it). ``streams``: ``(encoder name, view)`` pairs (:func:`coclr.study.plan.plan_study`
    resolves the names); two streams are evaluated together (two-stream fusion). ``paper``: linear probe, finetune
    and R@1 on UCF101 split 1 (None: not reported). ``miner``: for a CoCLR row of the second view, the row whose
    encoder mines the positives of all its stages (``pipeline.miner``; "": the other view's latest encoder, as in
    the paper); a row mined by an encoder trained with labels uses labels."""

    key: str
    method: str
    input: str
    labels: bool
    streams: tuple[tuple[str, str], ...]
    paper: tuple[float | None, float | None, float | None]
    method_name: str = ""
    miner: str = ""


INPUTS = {"rgb": "RGB", "flow": "Flow", "two_stream": "RGB+Flow"}


def _row(method_name: str, view: str, paper: tuple[float | None, float | None, float | None],
         variant: tuple[str, str] = ("", ""), miner: Row | None = None) -> Row:
    """The row of ``method_name`` (a key of :data:`METHODS`) on ``view`` (``rgb``, ``flow`` or ``two_stream``, the
    RGB and flow rows fused); ``variant``: (key part, display suffix) of an ablation, e.g. ``("k1", "K=1")``;
    ``miner``: the row whose encoder mines its positives (see :class:`Row`)."""
    spec = METHODS[method_name]
    key = "_".join(part for part in (method_name, variant[0], view) if part)
    streams = (((f"{method_name}_rgb", "rgb"), (f"{method_name}_flow", "flow")) if view == "two_stream"
               else ((key, view),))
    display = " ".join(part for part in (spec.display, variant[1]) if part)
    labels = spec.uses_labels or (miner is not None and miner.labels)
    return Row(key, display, INPUTS[view], labels, streams, paper, method_name, miner.key if miner else "")


_INFONCE_RGB = _row("infonce", "rgb", (46.8, 78.4, 33.1))
_UBERNCE_RGB = _row("ubernce", "rgb", (78.0, 80.0, 71.6))


ROWS: dict[str, Row] = {row.key: row for row in (
    _INFONCE_RGB,
    _row("infonce", "flow", (66.8, 83.1, 45.2)),
    _UBERNCE_RGB,
    _row("cross_entropy", "rgb", (None, 77.0, 73.5)),
    _row("cmc", "rgb", (55.0, None, None)),
    _row("coclr", "rgb", (70.2, 81.4, 51.8)),
    _row("coclr", "flow", (68.7, 83.5, 48.4)),
    _row("coclr", "two_stream", (72.1, 87.3, 55.6)),
    _row("coclr", "rgb", (60.5, 79.5, 48.5), ("k1", "K=1")),
    _row("coclr", "rgb", (68.3, 81.0, 49.8), ("k50", "K=50")),
    _row("coclr", "rgb", (65.2, 80.8, 48.0), ("sim", "sim")),
    _row("coclr", "rgb", (None, None, None), ("equal", "alt. equal updates")),
    _row("coclr", "flow", (None, None, None), ("ubernce_miner", "mined by UberNCE-RGB"), miner=_UBERNCE_RGB),
    _row("coclr", "flow", (None, None, None), ("infonce_miner", "mined by InfoNCE-RGB (frozen)"), miner=_INFONCE_RGB),
    _row("coclr", "rgb", (None, None, None), ("both", "mined in both views")),
    _row("coclr", "flow", (None, None, None), ("both", "mined in both views")),
)}
"""Every row of the paper's Table 1 (UCF101 split 1, pretrained on UCF101). CoCLR's main rows use
``train.method.topk`` (the paper's K = 5); the ablations K = 1 and K = 50 and 'sim' (both views trained at once)
change only that. 'alt. equal updates' is not in the paper: alternation with as many updates per network as
'sim' (each half-cycle as long as sim's cycle, the same lr schedule), to separate the schedule from the update
count. 'mined by UberNCE-RGB' and 'mined by InfoNCE-RGB (frozen)' are not in the paper either: CoCLR-Flow's two
cycles with every positive mined by that RGB encoder instead of CoCLR-RGB's latest (the oracle's, which knows the
labels, and InfoNCE-RGB's, the start, kept for both cycles), nothing else changed, to measure how much the quality
of RGB's mining decides what co-training does for flow. 'mined in both views' (both views' CoCLR rows, one
pipeline; not in the paper): every CoCLR stage mines the top-K of the summed similarity in the frozen other view and
in a frozen copy of the trained view as the stage started (``method.mine_in=both``), nothing else changed. The
paper marks its CMC row as using labels; CMC uses
none, and the row says so."""


def supervised_row(key: str) -> bool:
    """Whether row ``key`` is trained end to end with labels from a random encoder (its method has no positive
    rule): its finetuning is its training."""
    return not METHODS[ROWS[key].method_name].contrastive


QUICK_ROWS = ["infonce_rgb", "infonce_flow", "ubernce_rgb", "coclr_rgb", "coclr_flow", "coclr_two_stream"]
COLUMNS = ("linear", "finetune", "retrieval")
"""The columns: linear probe top-1, finetune top-1 (ten-crop test) and retrieval (R@1, and R@5/10/20)."""

# ------------------------------------------------------------------------------------ the quick study's data

STUDY_SYNTH: dict[str, Any] = {"train_scenes": 96, "test_scenes": 96, "actions_per_scene": 2, "frames": 12,
                               "actor_cue": 1.0}
"""The quick study's dataset, on top of the generator's defaults: 384 train clips from 96 scenes, each performing
two of the eight classes (places go with actions, as in real videos, so a clip's nearest RGB neighbours share its
class often enough for RGB to mine positives that teach flow); 384 test clips (a query set this large keeps the
binomial noise of R@1 near 2.5 points); 12 frames per clip (training clips have 8); and every object its class's
typical actor: the tiny RGB S3D learns RGB motion only after thousands of steps, so the RGB rows need appearance
that goes with the class, as in real videos (docs/synth.md)."""

@dataclass
class StudyData:
    """Where the videos come from, the clip store they are decoded into, and their optical flow."""

    source: Literal["synth", "ucf101", "hmdb51", "folder", "csv", "store"] = option(
        "synth", "synth: the built-in dataset; ucf101 / hmdb51: official split files (annotations) and videos "
        "(root); folder: root/<split>/<class>/<video>; csv: a manifest (annotations) of videos under root; store: "
        "an existing clip store (store)")
    synth: dict[str, Any] = option({}, "synthetic dataset options (`coclr data synth --list-options`), over the "
                                   "study's: " + ", ".join(f"{k}={v}" for k, v in STUDY_SYNTH.items()))
    root: str = option("", "folder of the videos (ucf101, hmdb51, folder, csv)")
    annotations: str = option("", "official split files folder (ucf101, hmdb51) or manifest (csv)")
    split: int = option(1, "official split number (ucf101, hmdb51)")
    store: str = option("", "the clip store: an existing one (source=store), or where to build it (default "
                            "OUT/store)")
    short_side: int = option(SHORT_SIDE, "frames are resized to this short side in the store")
    quality: int = option(JPEG_QUALITY, "JPEG quality of the store's frames")
    fps: float | None = option(None, "resample videos to this frame rate (null: keep every frame)")
    flow_backend: str = option("tvl1", "flow backend of `coclr flow` (tvl1, dis, tvl1-torch, auto)")
    flow_bound: float = option(20.0, "flow is clipped to +-flow_bound px before its uint8 storage (20: the paper's)")
    flow_workers: int = option(0, "worker processes of the store and flow jobs (0: the study's processes)")

    def validate(self) -> None:

        needs_root = self.source in ("ucf101", "hmdb51", "folder", "csv")
        require(not needs_root or bool(self.root), "root", f"is required with source={self.source}")
        require(self.source not in ("ucf101", "hmdb51", "csv") or bool(self.annotations), "annotations",
                f"is required with source={self.source}")
        require(self.source != "store" or bool(self.store), "store", "is required with source=store")
        require(self.split in (1, 2, 3), "split", "must be 1, 2 or 3")
        check_short_side(self.short_side, "short_side", least=32)
        require(1 <= self.quality <= 100, "quality", "must be in 1..100")
        require(self.fps is None or self.fps > 0, "fps", "must be positive (or null)")
        require(self.flow_backend in (*BACKENDS, "torch", "opencv"), "flow_backend",
                f"must be one of {', '.join(BACKENDS)}")
        check_workers(self.flow_workers, "flow_workers", zero="the study's processes")
        try:
            check_bound(self.flow_bound)
        except ValueError as error:
            require(False, "flow_bound", str(error))


@dataclass
class StudySchedule:
    """How long each stage trains and where it starts. Every stage after InfoNCE starts from the InfoNCE
    encoders, so that the rows differ only in their positives (and UberNCE in its labels)."""

    infonce_epochs: int = option(40, "epochs of InfoNCE per view")
    cycle_epochs: int = option(20, "epochs of each CoCLR half-cycle")
    cycles: int = option(2, "CoCLR cycles")
    cycle_lr: float | None = option(5e-4, "lr of the stages that start from the InfoNCE encoders (CoCLR, the "
                                    "oracle, CMC); null: train.optim.lr, as in the paper")
    decay_epochs: int = option(5, "the last decay_epochs epochs of every stage run at a tenth of its lr (the "
                               "reference's fixed milestones; 0: a constant lr, or the milestones below)")
    infonce_milestones: list[int] = option([], "lr milestones of the InfoNCE stages (instead of decay_epochs)")
    cycle_milestones: list[int] = option([], "lr milestones of each CoCLR stage (instead of decay_epochs)")
    ubernce_start: Literal["infonce", "scratch"] = option(
        "infonce", "what the UberNCE oracle starts from: infonce (the InfoNCE-RGB encoder, then cycles x "
        "cycle_epochs epochs at cycle_lr: CoCLR-RGB's start and epochs) or scratch (a random encoder, for as many "
        "RGB epochs in all)")
    ubernce_loss: Literal["mil", "supcon"] = option(
        "mil", "loss form of the oracle: mil (CoCLR's, so that only the positive set differs, as in the paper) or "
        "supcon (the authors' UberNCE code)")
    cmc_epochs: int = option(0, "epochs of CMC, both views at once from the InfoNCE encoders at cycle_lr (0: "
                             "cycles x cycle_epochs, as many as CoCLR-RGB)")
    supervised: dict[str, Any] = option({}, "the Cross-Entropy row: end-to-end training with labels from a "
                                        "random encoder, as finetuning options (`coclr eval finetune`): epochs "
                                        "(default infonce_epochs + cycles x cycle_epochs), lr, weight_decay, "
                                        "milestones, dropout (default 0.5), backbone_lr_scale (default 1)")

    def validate(self) -> None:
        for key in ("infonce_epochs", "cycle_epochs", "cycles"):
            require(getattr(self, key) >= 1, key, "must be at least 1")
        if self.cycle_lr is not None:
            require_learning_rate(self.cycle_lr, "cycle_lr")
        shortest = min(self.infonce_epochs, self.cycle_epochs)
        require(0 <= self.decay_epochs < shortest, "decay_epochs", f"must lie in 0..{shortest - 1} (below the "
                "shortest stage)")
        require(self.cmc_epochs >= 0, "cmc_epochs", "must be non-negative")

    def oracle_epochs(self) -> int:
        """Epochs of the oracle: as many RGB epochs as CoCLR-RGB gets after the oracle's start."""
        coclr_rgb = self.cycles * self.cycle_epochs
        return coclr_rgb if self.ubernce_start == "infonce" else self.infonce_epochs + coclr_rgb


@dataclass
class StudyEval:
    """How every row is evaluated: test clips, retrieval ks, the linear probe and finetuning."""

    length: int | None = option(None, "frames per test clip (null: the training clips')")
    stride: int | None = option(None, "frame stride of test clips (null: the training clips')")
    size: int | None = option(None, "crop side of test clips (null: the training clips')")
    batch_size: int = option(64, "clips per forward pass")
    ks: list[int] = option([1, 5, 10, 20], "retrieval R@k")
    linear: dict[str, Any] = option({}, "linear probe options (lrs, weight_decays, epochs, val_fraction)")
    finetune: dict[str, Any] = option({"epochs": 20, "milestones": [15]},
                                      "finetuning options (`coclr eval finetune`): epochs, lr, weight_decay, "
                                      "milestones, dropout, backbone_lr_scale")

    def validate(self) -> None:
        require(self.batch_size >= 1, "batch_size", "must be at least 1")
        require(bool(self.ks) and min(self.ks) >= 1, "ks", "must be at least 1")


STUDY_SETS = {"data.store": "the study's data.* options (its store)", "data.view": "rows (each row's views)",
              "data.second_view": "rows (each row's views)", "run.seed": "seed= (or --seed)",
              "run.out": "--out (each stage has its folder there)",
              "run.max_steps": "schedule.* (a study trains each stage to its end: a stage stopped early counted "
                               "as done, and the next ones started from it)"}
"""The ``coclr pretrain`` options the study sets for every stage (:func:`coclr.study.plan.base_options`), and the
study's option to give instead: a value given in ``train`` would be replaced without a word. (The epochs, the
schedule and the method are each stage's: refused as ``coclr pipeline`` refuses them.)"""


@dataclass
class StudyConfig:
    """A study: rows and columns of Table 1 on one dataset, trained and evaluated from one configuration.

    The defaults are the quick study on the built-in synthetic data, on CPU (``coclr demo``)."""

    seed: int = option(0, "seed of the dataset, initialisation, data order, augmentation and evaluation")
    rows: list[str] = option(QUICK_ROWS, "rows of Table 1: " + ", ".join(ROWS))
    columns: list[str] = option(["linear", "retrieval"], "columns: " + ", ".join(COLUMNS))
    data: StudyData = field(default_factory=StudyData, metadata={"help": "data"})
    train: dict[str, Any] = option(STUDY_TRAIN, "`coclr pretrain` options shared by every stage (`coclr pretrain "
                                   "--list-options`); the stages set the method, views, epochs, lr schedule, "
                                   "checkpoints and folders")
    schedule: StudySchedule = field(default_factory=StudySchedule, metadata={"help": "schedule"})
    eval: StudyEval = field(default_factory=StudyEval, metadata={"help": "evaluation"})
    processes: int = option(2, "jobs run at once (training runs, flow, finetuning; with gpus: one GPU each, in "
                            "turn): it only schedules the work, results are the same for any")
    threads: int = option(1, "CPU threads of each training and finetuning job on a CPU, whatever processes is: a "
                          "result depends on them (oneDNN orders a convolution's sums by the thread count, and "
                          "training grows the last bits), so they are a setting of the study; flow jobs, and jobs "
                          "on GPUs, share the cores. More may speed a full-width network on many cores")
    gpus: list[int] = option([], "GPU indices the jobs run on (empty: as train.run.device says)")

    def validate(self) -> None:
        check_seed(self.seed)  # (before the stages' run.seed it becomes, an option the study refuses)
        for name, section in self.train.items():
            require(section is None or isinstance(section, dict), f"train.{name}",
                    f"expected a mapping of `coclr pretrain` options, got {section!r}")
        for key, instead in STUDY_SETS.items():
            section, _, name = key.partition(".")
            require(name not in (self.train.get(section) or {}), f"train.{key}",
                    f"is set by the study for every stage; give {instead}")
        for task in ("linear", "finetune"):
            require("seed" not in getattr(self.eval, task), f"eval.{task}.seed",
                    "is the study's seed; give seed= (or --seed)")
        require("seed" not in self.data.synth, "data.synth.seed", "is the study's seed; give seed= (or --seed)")
        unknown = [row for row in self.rows if row not in ROWS]
        require(not unknown, "rows", f"unknown rows {unknown} (known: {', '.join(ROWS)})")
        require(len(set(self.rows)) == len(self.rows) and bool(self.rows), "rows", "must list rows, each once")
        unknown = [column for column in self.columns if column not in COLUMNS]
        require(not unknown and bool(self.columns), "columns", f"must be some of {', '.join(COLUMNS)}")
        require(len(set(self.columns)) == len(self.columns), "columns", "must list columns, each once")
        require(self.processes >= 1, "processes", "must be at least 1")
        require(self.threads >= 1, "threads", "must be at least 1")
        require(all(gpu >= 0 for gpu in self.gpus), "gpus", "must be GPU indices")
