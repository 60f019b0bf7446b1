"""A reduced one-seed run of `coclr demo`: every stage runs and every result file is written and well formed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from coclr.config import load_config
from coclr.data.synth import MOTIONS
from coclr.demo import (DEMO_AUGMENT, DEMO_FRAME_CACHE_MB, DEMO_OPTIONS, DEMO_SYNTH, DemoConfig, Job,
                        check_same_options, lanes_for, plan_training, results_markdown, run_lanes)
from coclr.errors import CoclrError, ConfigError
from coclr.train.config import MethodOptions

REDUCED = ["synth={train_scenes: 4, test_scenes: 2, num_classes: 4, actions_per_scene: 4, clips_per_action: 1, "
           "frames: 10, motions: [translate_up, zoom_in, rotate, circle]}", "flow_backend=dis", "batch_size=8",
           "queue_size=16", "topk=2", "infonce_epochs=1", "cycle_epochs=1", "warmup_epochs=0.5",
           "own_positive_epochs=0.5", "flow_bound=5",
           "decay_epochs=0"]  # one epoch per stage: nothing to decay


def test_reduced_demo_writes_every_result(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "coclr", "demo", "--out", str(out), "--seed", "3", *REDUCED],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["seed"] == 3 and results["wall_seconds"] > 0
    rows = {(row["method"], row["view"]): row for row in results["rows"]}
    assert set(rows) == {("InfoNCE", "RGB"), ("InfoNCE", "Flow"), ("UberNCE", "RGB"), ("CoCLR", "RGB"),
                         ("CoCLR", "Flow"), ("CoCLR", "RGB+Flow")}
    for row in rows.values():
        assert 0 <= row["linear_top1"] <= 100
        recall = [row["retrieval"][f"R@{k}"] for k in (1, 5, 10, 20)]
        assert all(0 <= r <= 100 for r in recall) and recall == sorted(recall)
    markdown = (out / "results.md").read_text()
    assert "| CoCLR | RGB+Flow |" in markdown and "gap closed" in markdown
    stages = results["stages"]
    assert [(s["stage"], s["view"]) for s in stages] == [
        ("infonce_rgb", "RGB"), ("infonce_flow", "Flow"), ("cycle1_rgb", "RGB"), ("cycle1_flow", "Flow"),
        ("cycle2_rgb", "RGB"), ("cycle2_flow", "Flow")]
    assert stages[-1]["R@1"] == rows[("CoCLR", "Flow")]["retrieval"]["R@1"]
    assert all(s["mined_precision"] is None for s in stages)  # 2 steps per stage: nothing logged (log_every 50)
    assert "| cycle2_rgb | RGB | " in markdown
    table = (out / "table.md").read_text()  # Labels read from the checkpoints: UberNCE's is a training one
    for row in (r"\| InfoNCE( ‡)? \| RGB \| ✗ \|", r"\| UberNCE( ‡)? \| RGB \| ✓ \|", r"\| CoCLR( ‡)? \| R\+F \| ✗ \|"):
        assert re.search(row, table), table  # ‡: one epoch per stage leaves these tiny encoders collapsed
    assert (out / "stage_recall.png").stat().st_size > 1000
    gallery = (out / "gallery.html").read_text()
    assert "data:image/gif;base64," in gallery and "http://" not in gallery and "https://" not in gallery
    manifest = json.loads((out / "pipeline" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["stages"]] == ["infonce_rgb", "infonce_flow", "cycle1_rgb", "cycle1_flow",
                                                       "cycle2_rgb", "cycle2_flow"]
    assert all(s["status"] == "done" for s in manifest["stages"])
    # CoCLR's dropped own key stays a negative, as in the authors' code (docs/synth.md).
    method = manifest["config"]["method"]
    reference = MethodOptions()
    assert (method["own_drop_prob"], method["dropped_own_as_negative"]) == (reference.own_drop_prob, True)
    assert method["own_positive_epochs"] == 0.5 and reference.own_positive_epochs == 0  # the demo's, passed on
    # The oracle uses CoCLR's loss by default, so that only the positive set differs.
    oracle_config = yaml.safe_load((out / "configs" / "ubernce_rgb.yaml").read_text())
    oracle = oracle_config["method"]
    assert (oracle["name"], oracle["loss_form"]) == ("ubernce", "mil") and method["loss_form"] == "auto"
    # ... and starts where CoCLR-RGB starts, for as many epochs as CoCLR-RGB's two stages.
    assert Path(oracle["init_checkpoint"]) == out / "pipeline" / "infonce_rgb" / "checkpoint_last.pth"
    assert oracle_config["optim"]["epochs"] == 2
    # InfoNCE trains at lr; the stages that start from its encoders (the oracle, CoCLR) at cycle_lr.
    demo_defaults = DemoConfig()
    assert oracle_config["optim"]["lr"] == demo_defaults.cycle_lr != demo_defaults.lr
    stage_lrs = {s["name"]: torch.load(out / "pipeline" / s["checkpoint"], weights_only=True)["config"]["optim"]["lr"]
                 for s in manifest["stages"]}
    assert stage_lrs == {"infonce_rgb": demo_defaults.lr, "infonce_flow": demo_defaults.lr,
                         **{f"cycle{c}_{v}": demo_defaults.cycle_lr for c in (1, 2) for v in ("rgb", "flow")}}
    oracle_log = (out / "ubernce_rgb" / "log.jsonl").read_text()
    assert sum('"epoch_loss"' in line for line in oracle_log.splitlines()) == 2
    stage = yaml.safe_load((out / "configs" / "infonce_rgb.yaml").read_text())
    assert stage["augment"]["crop_area"] == DEMO_AUGMENT["crop_area"] and stage["augment"]["blur_p"] == 0.0
    # Every training process keeps the decoded frames in memory (reads are the same; tests/test_datasets.py).
    assert stage["data"]["cache_mb"] == oracle_config["data"]["cache_mb"] == DEMO_FRAME_CACHE_MB > 0
    assert manifest["config"]["data"]["cache_mb"] == DEMO_FRAME_CACHE_MB
    synth = json.loads((out / "store" / "store.json").read_text())["meta"]["synth"]
    assert synth["actor_cue"] == DEMO_SYNTH["actor_cue"] and synth["train_scenes"] == 4 and synth["seed"] == 3
    classes = json.loads((out / "store" / "index.json").read_text())["classes"]
    assert classes == ["translate_up", "zoom_in", "rotate", "circle"]
    # Flow of the 16 train clips first; the 8 test clips' flow beside the oracle.
    assert "flow: 16 done" in result.stdout and "flow: 8 done" in (out / "logs" / "flow_test.log").read_text()
    # Both splits' flow at the demo's bound (the test split's, extracted by its own command, must agree).
    assert json.loads((out / "store" / "store.json").read_text())["meta"]["flow_bound_px"] == 5.0
    # Running it again finds everything done and reproduces the same numbers.
    again = subprocess.run([sys.executable, "-m", "coclr", "demo", "--out", str(out), "--seed", "3", *REDUCED],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["rows"] == results["rows"]
    # With another option it refuses at once, naming the option, and leaves the results as they were.
    before = (out / "results.json").read_text()
    other = subprocess.run([sys.executable, "-m", "coclr", "demo", "--out", str(out), "--seed", "3", *REDUCED,
                            "topk=3"], capture_output=True, text=True, timeout=600)
    assert other.returncode != 0 and "topk=2 (given 3)" in other.stderr, other.stderr[-3000:]
    assert (out / "results.json").read_text() == before


def test_a_demo_folder_continues_only_with_its_own_options(tmp_path: Path) -> None:
    """The first run records its options; a later one with the same options (or another process count)
    continues, and one with other options is refused with each differing option named, nested ones included."""
    check_same_options(load_config(DemoConfig, overrides=["cycle_epochs=30"]), tmp_path)
    recorded = json.loads((tmp_path / DEMO_OPTIONS).read_text())
    assert recorded["cycle_epochs"] == 30 and "processes" not in recorded
    assert recorded["synth"]["train_scenes"] == DEMO_SYNTH["train_scenes"] and recorded["augment"]["flip_p"] == 0.5
    check_same_options(load_config(DemoConfig, overrides=["cycle_epochs=30", "processes=1"]), tmp_path)
    changed = load_config(DemoConfig, overrides=["cycle_epochs=30", "seed=4", "synth.frames=10"])
    with pytest.raises(ConfigError, match=r"holds a demo started with .*seed=0 \(given 4\)") as error:
        check_same_options(changed, tmp_path)
    assert "synth.frames=12 (given 10)" in str(error.value) and "cycle_epochs" not in str(error.value)
    assert json.loads((tmp_path / DEMO_OPTIONS).read_text()) == recorded


def test_demo_options_override_the_demo_defaults_key_by_key() -> None:
    """``synth.x=...`` and ``augment.x=...`` change one option of the demo's dataset or augmentation and
    keep the rest of DEMO_SYNTH / DEMO_AUGMENT (not the generator's or the paper's defaults)."""
    config = load_config(DemoConfig, overrides=["synth.actor_cue=0.5", "augment.jitter_p=0.8", "seed=7"])
    synth = config.synth_config()
    assert (synth.actor_cue, synth.train_scenes, synth.actions_per_scene, synth.frames, synth.seed) == (
        0.5, DEMO_SYNTH["train_scenes"], DEMO_SYNTH["actions_per_scene"], 12, 7)
    augment = config.augment_options()
    assert augment["jitter_p"] == 0.8 and augment["crop_area"] == DEMO_AUGMENT["crop_area"]
    assert augment["gray_p"] == 0.0 and augment["flip_p"] == 0.5
    defaults = load_config(DemoConfig)
    assert defaults.synth_config().actor_cue == DEMO_SYNTH["actor_cue"]
    assert defaults.synth_config().classes == list(MOTIONS[:8])
    chosen = load_config(DemoConfig, overrides=["synth.motions=[zoom_in, rotate, still, circle]",
                                                "synth.num_classes=4"])
    assert chosen.synth_config().classes == ["zoom_in", "rotate", "still", "circle"]
    assert defaults.augment_options()["blur_p"] == DEMO_AUGMENT["blur_p"]


@pytest.mark.parametrize("override, key", [("synth.actor_cue=2", "synth.actor_cue"),
                                           ("synth.colour=1", "synth.colour"),
                                           ("synth.motions=[circle]", "synth.num_classes"),  # 1 name, 8 classes
                                           ("augment.crop_area=[0.5]", "augment.crop_area"),
                                           ("augment.gray_p=-1", "augment.gray_p"),
                                           ("warmup_epochs=30", "warmup_epochs"),
                                           ("cycle_lr=0", "cycle_lr"),
                                           ("flow_bound=-5", "flow_bound"),
                                           ("decay_epochs=20", "decay_epochs"),  # cycle_epochs: 20
                                           ("ubernce_loss=nce", "ubernce_loss"),
                                           ("ubernce_start=infonce_flow", "ubernce_start")])
def test_bad_demo_options_are_named_before_any_work(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(DemoConfig, overrides=[override])


def test_results_markdown_lists_the_stages_with_their_mined_precision() -> None:
    rows = [{"method": "InfoNCE", "view": "RGB", "linear_top1": 20.0,
             "retrieval": {"R@1": 25.0, "R@5": 50.0, "R@10": 60.0, "R@20": 70.0}}]
    stages = [{"stage": "infonce_rgb", "view": "RGB", "R@1": 25.0, "mined_precision": None},
              {"stage": "cycle1_rgb", "view": "RGB", "R@1": 41.4, "mined_precision": 46.25}]
    markdown = results_markdown(rows, {}, 60.0, 0, stages)
    assert "| infonce_rgb | RGB | 25.0 | - |" in markdown and "| cycle1_rgb | RGB | 41.4 | 46.2 |" in markdown
    assert "| Stage |" not in results_markdown(rows, {}, 60.0, 0)


def test_the_oracle_gets_as_many_rgb_epochs_as_coclr_rgb() -> None:
    """From InfoNCE-RGB the oracle trains for CoCLR-RGB's stages; from scratch, for InfoNCE's epochs too."""
    options = ["infonce_epochs=10", "cycle_epochs=3", "cycles=2", "own_positive_epochs=1", "decay_epochs=2"]
    assert load_config(DemoConfig, overrides=options).ubernce_epochs() == 6
    assert load_config(DemoConfig, overrides=[*options, "ubernce_start=scratch"]).ubernce_epochs() == 16


def _stage_optims(out: Path) -> dict[str, dict]:
    """The optim section of every training run the demo planned in ``out``: its own YAML files, and each CoCLR
    stage as the pipeline will configure it."""
    from coclr.train.config import PipelineConfig, PretrainConfig
    from coclr.train.pipeline import plan_stages, stage_config

    configs = out / "configs"
    optims = {name: vars(load_config(PretrainConfig, configs / f"{name}.yaml").optim)
              for name in ("infonce_rgb", "infonce_flow", "ubernce_rgb")}
    pipeline = load_config(PipelineConfig, configs / "pipeline.yaml")
    for stage in plan_stages(pipeline)[2:]:
        optims[stage.name] = vars(stage_config(pipeline, stage, out / "pipeline").optim)
    return optims


def test_decay_epochs_run_the_end_of_every_stage_at_a_tenth_of_its_lr(tmp_path: Path) -> None:
    """The last decay_epochs of each stage (InfoNCE: 10 epochs, CoCLR: 4, the oracle: 8) at lr x0.1; without
    decay every stage keeps a constant lr."""
    assert DemoConfig().decay_epochs == 5
    options = ["infonce_epochs=10", "cycle_epochs=4", "own_positive_epochs=1", "warmup_epochs=1"]
    first, second = plan_training(load_config(DemoConfig, overrides=[*options, "decay_epochs=3"]), tmp_path / "d",
                                  tmp_path / "store")
    assert [job.name for job in first] == ["infonce_rgb", "infonce_flow"]
    assert [job.name for job in second] == ["coclr", "ubernce_rgb", "flow_test"]
    optims = _stage_optims(tmp_path / "d")
    assert set(optims) == {"infonce_rgb", "infonce_flow", "ubernce_rgb", "cycle1_rgb", "cycle1_flow",
                           "cycle2_rgb", "cycle2_flow"}
    end = {name: optim["epochs"] - optim["milestones"][0] for name, optim in optims.items()}
    assert end == dict.fromkeys(optims, 3)
    assert {(optim["schedule"], optim["gamma"]) for optim in optims.values()} == {("milestones", 0.1)}
    assert (optims["infonce_rgb"]["epochs"], optims["cycle1_rgb"]["epochs"], optims["ubernce_rgb"]["epochs"]) == (
        10, 4, 8)
    plan_training(load_config(DemoConfig, overrides=[*options, "decay_epochs=0"]), tmp_path / "c", tmp_path / "store")
    assert {optim["schedule"] for optim in _stage_optims(tmp_path / "c").values()} == {"constant"}


def _job(name: str, argv: list[str], tmp_path: Path) -> Job:
    return Job(name, argv, [], 0, tmp_path / "logs" / f"{name}.log")


def _names(lanes: list[list[Job]]) -> list[list[str]]:
    return [[job.name for job in lane] for lane in lanes]


def test_lanes_put_the_first_job_alone_and_spread_the_others() -> None:
    jobs = [Job(name, [], [], 0, Path(name)) for name in ("chain", "oracle", "flow")]
    assert _names(lanes_for(jobs, 2)) == [["chain"], ["oracle", "flow"]]
    assert _names(lanes_for(jobs, 3)) == _names(lanes_for(jobs, 8)) == [["chain"], ["oracle"], ["flow"]]
    assert _names(lanes_for(jobs, 1)) == [["chain", "oracle", "flow"]]
    assert _names(lanes_for(jobs[:1], 2)) == [["chain"]]


def test_a_lane_runs_its_commands_in_order_and_stops_at_its_first_failure(tmp_path: Path) -> None:
    ok = ["flow", "--list-options"]
    bad = ["pretrain", "--config", str(tmp_path / "missing.yaml")]
    lanes = [[_job("first", ok, tmp_path), _job("broken", bad, tmp_path), _job("never", ok, tmp_path)],
             [_job("beside", ok, tmp_path), _job("after", ok, tmp_path)]]
    with pytest.raises(CoclrError, match="failed: broken") as raised:
        run_lanes(lanes, threads=1, desc="test")
    assert "missing.yaml" in str(raised.value)  # the failed command's log tail
    logs = tmp_path / "logs"
    assert all("warps" in (logs / f"{name}.log").read_text() for name in ("first", "beside", "after"))
    assert not (logs / "never.log").exists()
