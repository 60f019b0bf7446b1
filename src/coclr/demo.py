"""``coclr demo``: the paper's study (Table 1) on the built-in synthetic dataset, on a laptop CPU.

It generates the synthetic dataset (classes defined by motion, each with a typical actor; scenes shared
across classes: ``DEMO_SYNTH``), extracts TV-L1 flow, trains InfoNCE on RGB and on flow, the UberNCE
oracle on RGB and CoCLR (two cycles), evaluates retrieval and the linear probe of each (and of the
two-stream CoCLR), and writes ``results.json``, ``results.md``, the stage plot and the retrieval gallery.
Training runs are ordinary ``coclr pretrain`` and ``coclr pipeline`` commands on YAML files written to
``OUT/configs``, two at a time on a 2-core machine: the chain of CoCLR stages, the critical path, runs beside
the oracle and then the test split's flow (only evaluation needs it). The whole demo is resumable (run it
again to continue).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

import yaml

from coclr.config import differences, from_dict, option, require, to_dict
from coclr.errors import CoclrError, ConfigError

if TYPE_CHECKING:
    from coclr.data.synth import SynthConfig
    from coclr.eval.features import ClipConfig

ROWS = [  # (method, view, where its encoder is, relative to OUT)
    ("InfoNCE", "RGB", ["pipeline/infonce_rgb/encoder_rgb.pth"]),
    ("InfoNCE", "Flow", ["pipeline/infonce_flow/encoder_flow.pth"]),
    ("UberNCE", "RGB", ["ubernce_rgb/checkpoint_last.pth"]),
    ("CoCLR", "RGB", ["pipeline/{last}_rgb/encoder_rgb.pth"]),
    ("CoCLR", "Flow", ["pipeline/{last}_flow/encoder_flow.pth"]),
    ("CoCLR", "RGB+Flow", ["pipeline/{last}_rgb/encoder_rgb.pth", "pipeline/{last}_flow/encoder_flow.pth"]),
]


DEMO_SYNTH: dict[str, Any] = {"train_scenes": 96, "test_scenes": 96, "actions_per_scene": 2, "frames": 12,
                               "actor_cue": 1.0}
"""The demo's dataset, on top of the generator's defaults: 384 train clips from 96 scenes, each performing two of
the eight classes (places go with actions, as in real videos, so a clip's nearest RGB neighbours share its class
often enough for RGB to mine positives that teach flow: the co-training cycles then help each other); 384 test
clips (a query set this large keeps the binomial noise of R@1 near 2.5 points; with 128, the share of the gap
closed varied by about 12 points from evaluation alone); 12 frames per clip (less flow to extract; training
clips have 8); and every object its class's typical actor. Motion alone defines the class for flow, but the
demo's tiny RGB S3D learns RGB motion only after thousands of steps (docs/synth.md), so the RGB rows need
appearance that goes with the class, as in real videos; the scene's background still dominates it."""

DEMO_AUGMENT: dict[str, Any] = {"crop_area": [0.6, 1.0], "jitter_p": 0.0, "gray_p": 0.0, "blur_p": 0.0}
"""The demo's training augmentation, on top of the paper's: the paper's is sized for 128 px. At 32 px its
crops (down to 20% of the area) often leave out every object and its blur (up to 2 px) erases them, and
colour jitter and grayscale remove the actors' colours; with them, the multi-positive RGB losses (UberNCE,
CoCLR) collapse to the uniform solution before any class is found. Flips are kept."""


@dataclass
class DemoConfig:
    """Sizes and schedule of the demo; the defaults finish in under ten minutes on two CPU cores."""

    seed: int = option(0, "seed of the dataset, initialisation, data order and augmentation")
    synth: dict[str, Any] = option({}, "synthetic dataset options (`coclr data synth --list-options`), over "
                                   "the demo's DEMO_SYNTH: " + ", ".join(f"{k}={v}" for k, v in DEMO_SYNTH.items()))
    augment: dict[str, Any] = option({}, "training augmentation options (crop_area, flip_p, jitter_p, gray_p, "
                                     "blur_p), over the demo's DEMO_AUGMENT: "
                                     + ", ".join(f"{k}={v}" for k, v in DEMO_AUGMENT.items()))
    flow_backend: str = option("tvl1", "flow backend of `coclr flow` (tvl1, dis, tvl1-torch, auto)")
    flow_bound: float = option(20.0, "flow is clipped to +-flow_bound px before its uint8 storage (`coclr flow "
                               "--bound`): 20 is the paper's (I3D) convention; 5 keeps its precision relative to "
                               "the motion at 32 px (docs/synth.md measures it)")
    width: float = option(0.125, "S3D width multiplier")
    length: int = option(8, "frames per clip")
    stride: int = option(1, "temporal stride of clips")
    size: int = option(32, "crop size")
    batch_size: int = option(32, "clips per step")
    queue_size: int = option(128, "momentum queue size K")
    momentum: float = option(0.99, "key encoder EMA (lower than the paper's 0.999: the runs are short)")
    temperature: float = option(0.07, "softmax temperature")
    lr: float = option(1e-3, "Adam learning rate of the stages that start from a random encoder (InfoNCE, and the "
                       "oracle with ubernce_start=scratch)")
    cycle_lr: float = option(5e-4, "Adam learning rate of the stages that start from the InfoNCE encoders: the "
                             "CoCLR stages and the oracle (with ubernce_start=infonce). At 1e-3 the oracle was "
                             "still far from converged after its 40 epochs on some seeds, and flow gained "
                             "nothing from the co-training (docs/synth.md)")
    decay_epochs: int = option(5, "the last decay_epochs epochs of every training stage run at a tenth of its lr "
                               "(the reference's fixed milestones, lr x0.1; 0: a constant lr). With a constant lr "
                               "the oracle of the default seed ended below CoCLR-RGB on one machine (docs/synth.md)")
    warmup_epochs: float = option(2.0, "epochs of linear lr warm-up at the start of every training stage (a "
                                  "CoCLR stage starts from a trained encoder with a fresh Adam state)")
    topk: int = option(5, "CoCLR positives mined per query")
    own_positive_epochs: float = option(4.0, "epochs at the start of each CoCLR stage in which every own key stays "
                                        "a positive (`method.own_positive_epochs`; the reference: 0): from an "
                                        "InfoNCE start the stages otherwise fall to the uniform solution at this "
                                        "size (docs/synth.md)")
    infonce_epochs: int = option(40, "epochs of InfoNCE per view")
    cycle_epochs: int = option(20, "epochs of each CoCLR half-cycle")
    cycles: int = option(2, "CoCLR cycles")
    ubernce_start: Literal["infonce", "scratch"] = option(
        "infonce", "what the UberNCE oracle starts from: infonce (the InfoNCE-RGB encoder, then cycles x "
        "cycle_epochs epochs: CoCLR-RGB's start and epochs, so that only the positives differ) or scratch (a random "
        "encoder, then infonce_epochs + cycles x cycle_epochs epochs: as many RGB epochs in all; docs/synth.md "
        "compares the two)")
    ubernce_loss: Literal["mil", "supcon"] = option(
        "mil", "loss form of the UberNCE oracle: mil (CoCLR's multi-instance NCE, so that only the positive set "
        "differs, as in the paper) or supcon (the authors' UberNCE code; a weaker, seed-dependent oracle at the "
        "demo's size, docs/synth.md)")
    processes: int = option(2, "commands run at once (training runs, the test split's flow), one thread each "
                                "(one process: two threads)")

    def validate(self) -> None:
        from coclr.data.flow.encode import check_bound

        self.synth_config()
        self.augment_options()
        require(self.cycles >= 1, "cycles", "must be at least 1")
        require(self.processes >= 1, "processes", "must be at least 1")
        try:
            check_bound(self.flow_bound)
        except ValueError as error:
            raise ConfigError(f"flow_bound: {error}") from None
        for key in ("lr", "cycle_lr"):
            require(getattr(self, key) > 0, key, "must be positive")
        for key in ("infonce_epochs", "cycle_epochs"):
            require(getattr(self, key) >= 1, key, "must be at least 1")
        shortest = min(self.infonce_epochs, self.cycle_epochs)
        require(0 <= self.warmup_epochs <= shortest, "warmup_epochs", f"must lie in 0..{shortest} (the shortest stage)")
        require(0 <= self.decay_epochs < shortest, "decay_epochs", f"must lie in 0..{shortest - 1} (below the "
                "shortest stage)")
        require(0 <= self.own_positive_epochs <= self.cycle_epochs, "own_positive_epochs",
                f"must lie in 0..{self.cycle_epochs} (cycle_epochs)")

    def ubernce_epochs(self) -> int:
        """Epochs of the oracle: as many RGB epochs as CoCLR-RGB gets after the oracle's start."""
        coclr_rgb = self.cycles * self.cycle_epochs
        return coclr_rgb if self.ubernce_start == "infonce" else self.infonce_epochs + coclr_rgb

    def synth_config(self) -> SynthConfig:
        """The dataset's :class:`SynthConfig`: DEMO_SYNTH, then ``synth``, with the demo's seed."""
        from coclr.data.synth import SynthConfig

        return from_dict(SynthConfig, {**DEMO_SYNTH, **self.synth, "seed": self.seed}, prefix="synth.")

    def clip_config(self) -> ClipConfig:
        """How evaluation cuts clips: the training clips' length, stride and size."""
        from coclr.eval.features import ClipConfig

        return ClipConfig(length=self.length, stride=self.stride, size=self.size, batch_size=64)

    def augment_options(self) -> dict[str, Any]:
        """The training ``augment`` section: DEMO_AUGMENT, then ``augment`` (validated)."""
        from coclr.train.config import AugmentOptions

        return to_dict(from_dict(AugmentOptions, {**DEMO_AUGMENT, **self.augment}, prefix="augment."))


DEMO_FRAME_CACHE_MB = 256
"""Decoded frames each training process keeps in memory (``data.cache_mb``): the default demo's train split is
about 14 MiB per view, and decoding it again every epoch took about a quarter of a CoCLR epoch (run alone).
Reads are the same with or without the cache, so the results are too."""


def _training_options(config: DemoConfig, store: Path) -> dict[str, Any]:
    return {
        "data": {"store": str(store), "view": "rgb", "second_view": "flow", "length": config.length,
                 "stride": config.stride, "size": config.size, "workers": 0, "cache_mb": DEMO_FRAME_CACHE_MB},
        "model": {"width": config.width},
        "method": {"queue_size": config.queue_size, "temperature": config.temperature, "momentum": config.momentum,
                   "topk": config.topk, "own_positive_epochs": config.own_positive_epochs,
                   "wait_for_full_queue": True},
        "optim": {"lr": config.lr, "schedule": "milestones" if config.decay_epochs else "constant",
                  "warmup_epochs": config.warmup_epochs},
        "augment": config.augment_options(),
        "run": {"batch_size": config.batch_size, "seed": config.seed, "progress": False, "log_every": 50,
                "device": "cpu"},
    }


def _decay_milestones(config: DemoConfig, **stage_epochs: int) -> dict[str, list[int]]:
    """Each named milestone list: the epoch at which a stage of that many epochs starts its last
    ``decay_epochs`` (none without decay)."""
    if not config.decay_epochs:
        return {}
    return {key: [epochs - config.decay_epochs] for key, epochs in stage_epochs.items()}


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    from coclr.atomic import atomic_write_text

    return atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))


@dataclass
class Job:
    """One training command run as a child process, with the run folders whose epochs show its progress."""

    name: str
    argv: list[str]
    runs: list[Path]
    epochs: int
    log: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    def epochs_done(self) -> int:
        done = 0
        for run in self.runs:
            log = run / "log.jsonl"
            if log.is_file():
                done += sum('"epoch_loss"' in line for line in log.read_text().splitlines())
        return min(done, self.epochs)


def run_lanes(lanes: list[list[Job]], threads: int, desc: str) -> None:
    """Run lanes side by side, each lane's commands one after another with ``threads`` threads, showing their
    combined training epochs. A lane stops at its first failure (the others finish); then the failures raise."""
    from tqdm import tqdm

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    jobs = [job for lane in lanes for job in lane]

    def start(job: Job) -> Job:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        with job.log.open("a") as log:
            job.process = subprocess.Popen([sys.executable, "-m", "coclr", *job.argv], stdout=log,
                                           stderr=subprocess.STDOUT, env=env)
        return job

    waiting = [list(lane) for lane in lanes if lane]
    running = [start(lane.pop(0)) for lane in waiting]
    failed = []
    with tqdm(total=sum(job.epochs for job in jobs), desc=desc, unit="epoch", dynamic_ncols=True) as bar:
        while any(job is not None for job in running):
            time.sleep(1.0)
            for index, job in enumerate(running):
                if job is None or job.process.poll() is None:
                    continue
                if job.process.returncode != 0:
                    failed.append(job)
                    waiting[index].clear()
                running[index] = start(waiting[index].pop(0)) if waiting[index] else None
            bar.update(sum(job.epochs_done() for job in jobs) - bar.n)
    if failed:
        tails = "\n".join(f"--- {job.name} ({job.log}):\n" + "\n".join(job.log.read_text().splitlines()[-15:])
                          for job in failed)
        raise CoclrError(f"failed: {', '.join(job.name for job in failed)}\n{tails}")


def lanes_for(jobs: list[Job], processes: int) -> list[list[Job]]:
    """At most ``processes`` lanes: the first job (the longest) alone in the first lane, the others spread over
    the rest in order; with one process, every job in one lane, in order."""
    if processes <= 1 or len(jobs) <= 1:
        return [list(jobs)]
    lanes: list[list[Job]] = [[jobs[0]]] + [[] for _ in range(min(processes, len(jobs)) - 1)]
    for index, job in enumerate(jobs[1:]):
        lanes[1 + index % (len(lanes) - 1)].append(job)
    return lanes


def plan_training(config: DemoConfig, out: Path, store: Path) -> tuple[list[Job], list[Job]]:
    """Write every training configuration under ``OUT/configs`` and return the commands of the two phases:
    InfoNCE of both views; then the CoCLR cycles, the UberNCE oracle and the test split's flow."""
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import LAST, plan_stages, stage_config

    base = _training_options(config, store)
    pipeline = {**base, "pipeline": {"cycles": config.cycles, "infonce_epochs": config.infonce_epochs,
                                     "cycle_epochs": config.cycle_epochs, "mode": "alternate",
                                     "cycle_lr": config.cycle_lr,
                                     **_decay_milestones(config, infonce_milestones=config.infonce_epochs,
                                                         cycle_milestones=config.cycle_epochs)},
                "run": {**base["run"], "out": str(out / "pipeline")}}
    pipeline_config = from_dict(PipelineConfig, pipeline)
    pipeline_yaml = _write_yaml(out / "configs" / "pipeline.yaml", pipeline)
    stages = plan_stages(pipeline_config)
    logs = out / "logs"
    first = []
    for stage in stages[:2]:
        stage_yaml = _write_yaml(out / "configs" / f"{stage.name}.yaml",
                                 to_dict(stage_config(pipeline_config, stage, out / "pipeline")))
        first.append(Job(stage.name, ["pretrain", "--config", str(stage_yaml), "--resume"],
                         [out / "pipeline" / stage.name], stage.epochs, logs / f"{stage.name}.log"))

    oracle_method = {**base["method"], "name": "ubernce", "loss_form": config.ubernce_loss}
    oracle_optim = {**base["optim"], "epochs": config.ubernce_epochs(),
                    **_decay_milestones(config, milestones=config.ubernce_epochs())}
    if config.ubernce_start == "infonce":  # trained like CoCLR-RGB: from InfoNCE-RGB, at CoCLR's lr
        oracle_method["init_checkpoint"] = str(out / "pipeline" / stages[0].name / LAST)  # trained first
        oracle_optim["lr"] = config.cycle_lr
    ubernce = {**base, "method": oracle_method, "optim": oracle_optim,
               "run": {**base["run"], "out": str(out / "ubernce_rgb")}}
    ubernce_yaml = _write_yaml(out / "configs" / "ubernce_rgb.yaml", ubernce)
    cycles = stages[2:]
    second = [
        Job("coclr", ["pipeline", "--config", str(pipeline_yaml)], [out / "pipeline" / s.name for s in cycles],
            sum(s.epochs for s in cycles), logs / "pipeline.log"),
        Job("ubernce_rgb", ["pretrain", "--config", str(ubernce_yaml), "--resume"], [out / "ubernce_rgb"],
            config.ubernce_epochs(), logs / "ubernce_rgb.log"),
        Job("flow_test", ["flow", str(store), "--backend", config.flow_backend, "--view", "flow", "--split", "test",
                          "--bound", repr(config.flow_bound), "--workers", "1"], [], 0, logs / "flow_test.log"),
    ]
    return first, second


def train_all(config: DemoConfig, out: Path, store: Path) -> None:
    """InfoNCE of both views side by side; then the CoCLR cycles (the critical path) beside the UberNCE oracle
    and, once the oracle is done, the test split's flow (needed only for evaluation)."""
    first, second = plan_training(config, out, store)
    threads = 1 if config.processes > 1 else 2
    run_lanes(lanes_for(first, config.processes), threads, "InfoNCE (RGB, flow)")
    run_lanes(lanes_for(second, config.processes), threads, "CoCLR cycles | UberNCE, then test flow")


def evaluate_all(config: DemoConfig, out: Path, store) -> list[dict[str, Any]]:
    """Retrieval and linear probe of every row of the table (``store``: the opened clip store); returns the
    evaluation records."""
    from coclr.atomic import atomic_write_json
    from coclr.eval.features import Stream
    from coclr.eval.linear import evaluate_linear
    from coclr.eval.retrieval import evaluate_retrieval

    clips = config.clip_config()
    cache = out / "feature_cache"
    last = f"cycle{config.cycles}"
    records = []
    for method, view, paths in ROWS:
        views = ["rgb", "flow"] if view == "RGB+Flow" else [view.lower()]
        streams = [Stream(out / p.format(last=last), v) for p, v in zip(paths, views)]
        retrieval = evaluate_retrieval(store, streams, clips, cache_dir=cache, progress=False)
        linear, _, _ = evaluate_linear(store, streams, clips, cache_dir=cache, progress=False)
        for record in (retrieval, linear):
            record["name"] = method
            atomic_write_json(out / "eval" / f"{method}_{view}_{record['task']}.json".replace("+", "_"), record)
        records.append({"method": method, "view": view, "retrieval": retrieval, "linear": linear})
    return records


def claims(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The paper's claims checked on these results (Table 1 ordering and the share of the gap closed)."""
    get = {(r["method"], r["view"]): r for r in rows}
    infonce, uber, coclr, flow = (get[("InfoNCE", "RGB")], get[("UberNCE", "RGB")], get[("CoCLR", "RGB")],
                                  get[("InfoNCE", "Flow")])
    r1 = {k: v["retrieval"]["R@1"] for k, v in (("infonce", infonce), ("uber", uber), ("coclr", coclr),
                                                   ("flow", flow))}
    lin = {k: v["linear_top1"] for k, v in (("infonce", infonce), ("uber", uber), ("coclr", coclr), ("flow", flow))}
    gap = r1["uber"] - r1["infonce"]
    closed = (r1["coclr"] - r1["infonce"]) / gap if gap > 0 else None  # undefined without a gap
    return {
        "UberNCE-RGB > CoCLR-RGB > InfoNCE-RGB (R@1)": r1["uber"] > r1["coclr"] > r1["infonce"],
        "UberNCE-RGB > CoCLR-RGB > InfoNCE-RGB (linear probe)": lin["uber"] > lin["coclr"] > lin["infonce"],
        "InfoNCE-Flow > InfoNCE-RGB (R@1)": r1["flow"] > r1["infonce"],
        "gap closed by CoCLR-RGB (R@1)": closed,
    }


def results_markdown(rows: list[dict[str, Any]], checks: dict[str, Any], seconds: float, seed: int,
                     stages: Sequence[dict[str, Any]] = ()) -> str:
    lines = [f"# coclr demo (seed {seed}, {seconds / 60:.1f} min)", "",
             "Synthetic dataset: classes are defined by motion, each with a typical actor (shape and colours); "
             "backgrounds belong to scenes, each performing more than one class. "
             "Pretrained and evaluated on the same data (train scenes) as the paper's Table 1; test scenes "
             "query train scenes.", "",
             "| Method | Input | Labels | Linear probe | R@1 | R@5 | R@10 | R@20 |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        r = row["retrieval"]
        labels = "✓" if row["method"] == "UberNCE" else "✗"
        lines.append(f"| {row['method']} | {row['view']} | {labels} | {row['linear_top1']:.1f} | {r['R@1']:.1f} | "
                     f"{r['R@5']:.1f} | {r['R@10']:.1f} | {r['R@20']:.1f} |")
    lines += ["", "Claims of the paper on these results:", ""]
    for claim, value in checks.items():
        if isinstance(value, bool):
            shown = "yes" if value else "no"
        else:
            shown = "undefined (UberNCE-RGB is not above InfoNCE-RGB)" if value is None else f"{100 * value:.0f}%"
        lines.append(f"- {claim}: {shown}")
    if stages:
        lines += ["", "Pretraining stages: R@1 of the network each trained, and for CoCLR the share of its mined "
                  "positives (top-K in the other view) that had the query's class:", "",
                  "| Stage | Trains | R@1 | Mined positives of the class (%) |", "|---|---|---|---|"]
        for stage in stages:
            precision = stage["mined_precision"]
            shown = "-" if precision is None else f"{precision:.1f}"
            lines.append(f"| {stage['stage']} | {stage['view']} | {stage['R@1']:.1f} | {shown} |")
    lines += ["", "Files: `results.json`, `stage_recall.png` (R@1 across the co-training stages), `gallery.html` "
              "(test queries and their nearest train videos), `eval/` (full records), `configs/` (every "
              "training configuration used)."]
    return "\n".join(lines) + "\n"


DEMO_OPTIONS = "demo_options.json"
"""The file in the demo's folder that records the options it was started with (all but ``processes``)."""


def check_same_options(config: DemoConfig, out: Path) -> None:
    """Record the demo's options in ``out``, or, if ``out`` holds a demo started with other options, refuse to
    continue it, naming every option that differs. ``synth`` and ``augment`` are recorded in full (the demo's
    defaults merged with the given ones). ``processes`` is left out: it changes only how the work is scheduled,
    so a demo may continue with another value."""
    from coclr.atomic import atomic_write_json

    options = {**to_dict(config), "synth": to_dict(config.synth_config()), "augment": config.augment_options()}
    del options["processes"]
    path = out / DEMO_OPTIONS
    if path.is_file():
        differ = differences(json.loads(path.read_text()), options)
        if differ:
            raise ConfigError(f"--out: {out} holds a demo started with {', '.join(differ)}: use another folder "
                              "or the same options")
    else:
        atomic_write_json(path, options)


def run_demo(config: DemoConfig, out: str | Path) -> dict[str, Any]:
    """Run the whole demo into ``out`` and return the ``results.json`` content."""
    from coclr.data.flow.extract import extract_flow
    from coclr.data.synth import generate_synthetic
    from coclr.atomic import atomic_write_json, atomic_write_text
    from coclr.data.store import open_store
    from coclr.eval.report import report_run, view_name, write_report

    started = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    check_same_options(config, out)
    synth = config.synth_config()
    store = out / "store"
    print(f"[1/5] synthetic dataset -> {store}", flush=True)
    print(generate_synthetic(store, synth, workers=config.processes), flush=True)
    print(f"[2/5] optical flow of the train split ({config.flow_backend})", flush=True)
    print(extract_flow(store, backend=config.flow_backend, view="flow", workers=config.processes, split="train",
                       bound=config.flow_bound),
          flush=True)
    print("[3/5] pretraining: InfoNCE (RGB, flow), then the CoCLR cycles beside the UberNCE oracle and the test "
          "split's flow", flush=True)
    train_all(config, out, store)
    print("[4/5] evaluation: retrieval R@k and linear probe", flush=True)
    opened = open_store(store)
    evaluated = evaluate_all(config, out, opened)
    rows = [{"method": e["method"], "view": e["view"], "linear_top1": e["linear"]["results"]["top1"],
             "retrieval": {k: e["retrieval"]["results"][k] for k in ("R@1", "R@5", "R@10", "R@20")}}
            for e in evaluated]
    print("[5/5] report: stage plot and retrieval gallery", flush=True)
    stage_records = report_run(out / "pipeline", opened, out, config.clip_config(), cache_dir=out / "feature_cache",
                               progress=False)
    stages = [{"stage": r["stage"], "view": view_name(r["streams"][0]["view"]), "R@1": r["results"]["R@1"],
               "mined_precision": r.get("mined_precision")} for r in stage_records]
    records = [e[task] for e in evaluated for task in ("linear", "retrieval")]
    coclr_rgb = next(e["retrieval"] for e in evaluated if (e["method"], e["view"]) == ("CoCLR", "RGB"))
    write_report(out, [*records, coclr_rgb], opened)
    seconds = time.time() - started
    checks = claims(rows)
    results = {"seed": config.seed, "wall_seconds": round(seconds, 1), "rows": rows, "claims": checks,
               "stages": stages, "config": to_dict(config)}
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "results.md", results_markdown(rows, checks, seconds, config.seed, stages))
    return results
