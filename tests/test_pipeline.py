"""The whole CoCLR schedule in one run folder: stages, manifest, initialisation chain, re-run continues."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from coclr.config import load_config
from coclr.errors import CoclrError, ConfigError
from coclr.models.loading import load_encoder, read_clip_settings
from coclr.train.config import PipelineConfig
from coclr.train.pipeline import plan_stages, run_pipeline, stage_config
from conftest import make_random_store
from test_train import TINY


def pipeline_config(store: Path, out: Path, *overrides: str) -> PipelineConfig:
    return load_config(PipelineConfig, None, [f"data.store={store}", f"run.out={out}", *TINY,
                                              "pipeline.infonce_epochs=1", "pipeline.cycle_epochs=1",
                                              "pipeline.cycles=1", *overrides])


def test_stage_plan_follows_the_paper() -> None:
    config = load_config(PipelineConfig, None, ["data.store=s", "run.out=o", "pipeline.cycles=2"])
    stages = plan_stages(config)
    assert [s.name for s in stages] == ["infonce_rgb", "infonce_flow", "cycle1_rgb", "cycle1_flow",
                                        "cycle2_rgb", "cycle2_flow"]
    cycle2_flow = stages[-1]
    assert cycle2_flow.init_from == {"flow": "cycle1_flow"} and cycle2_flow.sampler_from == "cycle2_rgb"
    assert stages[2].init_from == {"rgb": "infonce_rgb"} and stages[2].sampler_from == "infonce_flow"
    sim = plan_stages(load_config(PipelineConfig, None, ["data.store=s", "run.out=o", "pipeline.mode=sim"]))
    assert [s.name for s in sim] == ["infonce_rgb", "infonce_flow", "cycle1_sim", "cycle2_sim"]
    assert sim[2].trains == ["rgb", "flow"] and sim[2].epochs == 200


@pytest.mark.parametrize("mode", ["alternate", "sim"])
def test_cycle_lr_sets_the_lr_of_the_coclr_stages_only(mode: str) -> None:
    options = ["data.store=s", "run.out=o", "optim.lr=0.001", f"pipeline.mode={mode}"]
    for cycle_lr, expected in (([], 0.001), (["pipeline.cycle_lr=0.0005"], 0.0005)):
        config = load_config(PipelineConfig, None, [*options, *cycle_lr])
        lrs = {stage.name: stage_config(config, stage, Path("o")).optim.lr for stage in plan_stages(config)}
        assert lrs["infonce_rgb"] == lrs["infonce_flow"] == 0.001
        cycles = [lr for name, lr in lrs.items() if name.startswith("cycle")]
        assert len(cycles) == (4 if mode == "alternate" else 2) and set(cycles) == {expected}


def test_a_bad_cycle_lr_is_named() -> None:
    with pytest.raises(ConfigError, match=r"pipeline\.cycle_lr"):
        load_config(PipelineConfig, None, ["data.store=s", "run.out=o", "pipeline.cycle_lr=0"])


@pytest.mark.parametrize("given, instead", [("optim.epochs=5", "pipeline.infonce_epochs"),
                                             ("method.name=cmc", "pipeline.mode"),
                                             ("method.init_checkpoint=x.pth", "pipeline.init"),
                                             ("method.sampler_checkpoint=x.pth", "pipeline.miner"),
                                             ("optim.milestones=[3]", "pipeline.infonce_milestones"),
                                             ("method.simultaneous=true", "pipeline.mode=sim")])
def test_an_option_each_stage_sets_is_refused_naming_the_pipelines(given, instead) -> None:
    """The stages set these: a value given was dropped without a word (a missing checkpoint never checked), then
    its record refused a later run that left it out."""
    key = given.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}: is set by each stage of a pipeline: give {instead}"):
        load_config(PipelineConfig, None, ["data.store=s", "run.out=o", given])


def test_a_folder_started_with_an_option_each_stage_sets_continues_without_it(tmp_path: Path) -> None:
    """Such an option was recorded, then dropped; now it is refused, and a folder that recorded one would have been
    refused ("optim.epochs=5 (given 300)") for the command without it: it never changed the pipeline's work."""
    from coclr.config import to_dict
    from coclr.runfolder import check_folder, claim_folder
    from coclr.train.pipeline import PIPELINE_FOLDER

    options = to_dict(load_config(PipelineConfig, None, ["data.store=s", f"run.out={tmp_path / 'p'}"]))
    before = {**options, "optim": {**options["optim"], "epochs": 5}, "method": {**options["method"], "name": "cmc"}}
    with claim_folder(tmp_path / "p", PIPELINE_FOLDER, before):
        pass
    assert check_folder(tmp_path / "p", PIPELINE_FOLDER, options) is True


@pytest.mark.parametrize("mode", ["alternate", "sim"])
def test_pipeline_end_to_end_and_rerun(tmp_path: Path, mode: str) -> None:
    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    run_dir = run_pipeline(pipeline_config(store, tmp_path / "run", f"pipeline.mode={mode}"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    expected = (["infonce_rgb", "infonce_flow", "cycle1_rgb", "cycle1_flow"] if mode == "alternate"
                else ["infonce_rgb", "infonce_flow", "cycle1_sim"])
    assert [s["name"] for s in manifest["stages"]] == expected
    assert all(s["status"] == "done" for s in manifest["stages"])
    for stage in manifest["stages"]:
        backbone, head = load_encoder(run_dir / stage["checkpoint"])
        assert head is not None
        for view, path in stage["encoders"].items():
            load_encoder(run_dir / path)
            # Every exported encoder records the clips it was trained on, for evaluation and embedding.
            settings = read_clip_settings(run_dir / path)
            assert settings["view"] == view and (settings["length"], settings["stride"]) == (8, 1)
            assert settings["size"] == 32 and settings["mean"] == [0.485, 0.456, 0.406]
            assert (settings["flow_bound"] is None) == (view == "rgb")
    # Each co-training stage starts from its view's previous stage and mines with the other view's latest.
    last = manifest["stages"][-1]
    config = torch.load(run_dir / last["checkpoint"], weights_only=True)["config"]
    if mode == "alternate":
        assert config["method"]["name"] == "coclr" and config["data"]["view"] == "flow"
        assert config["method"]["sampler_checkpoint"].endswith("cycle1_rgb/encoder_rgb.pth")
        assert config["method"]["init_checkpoint"].endswith("infonce_flow/encoder_flow.pth")
    else:
        assert config["method"]["simultaneous"] and config["method"]["second_init_checkpoint"]
    # Running the same command again finds every stage done and trains nothing.
    stamp = (run_dir / last["checkpoint"]).stat().st_mtime_ns
    run_pipeline(pipeline_config(store, tmp_path / "run", f"pipeline.mode={mode}"))
    assert (run_dir / last["checkpoint"]).stat().st_mtime_ns == stamp


def test_pipeline_continues_an_unfinished_stage(tmp_path: Path) -> None:
    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    config = pipeline_config(store, tmp_path / "run", "run.max_steps=1")
    run_pipeline(config)  # stops inside the first stage
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"][0]["status"] == "running"
    run_pipeline(pipeline_config(store, tmp_path / "run"))
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert all(s["status"] == "done" for s in manifest["stages"])
    log = (tmp_path / "run" / "infonce_rgb" / "log.jsonl").read_text().splitlines()
    assert json.loads(log[0])["step"] == 1 and json.loads(log[-1])["step"] == 2


@pytest.mark.slow
def test_pipeline_until_stops_after_the_stage_and_a_later_run_continues(tmp_path: Path) -> None:
    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="cycle9_rgb.*infonce_rgb, infonce_flow, cycle1_rgb, cycle1_flow"):
        run_pipeline(pipeline_config(store, run_dir), until="cycle9_rgb")
    assert not run_dir.exists()  # refused before any work
    run_pipeline(pipeline_config(store, run_dir), until="infonce_flow")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [s["status"] for s in manifest["stages"]] == ["done", "done", "pending", "pending"]
    assert not (run_dir / "cycle1_rgb").exists()
    stamp = (run_dir / "infonce_flow" / "encoder_flow.pth").stat().st_mtime_ns
    run_pipeline(pipeline_config(store, run_dir), until="infonce_flow")  # done already: trains nothing more
    assert not (run_dir / "cycle1_rgb").exists()
    before = (run_dir / "manifest.json").read_text()
    with pytest.raises(ConfigError, match=r"holds a pipeline run with pipeline\.cycle_epochs=1 \(given 2\); use"):
        run_pipeline(pipeline_config(store, run_dir, "pipeline.cycle_epochs=2"))
    assert (run_dir / "manifest.json").read_text() == before and not (run_dir / "cycle1_rgb").exists()
    run_pipeline(pipeline_config(store, run_dir))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert all(s["status"] == "done" for s in manifest["stages"])
    assert (run_dir / "infonce_flow" / "encoder_flow.pth").stat().st_mtime_ns == stamp


def test_a_pipeline_refuses_changed_options_and_keeps_its_record(tmp_path: Path, capsys) -> None:
    """After --until infonce_rgb, a rerun with another width and topk is refused before any stage trains, naming
    both; the manifest keeps the configuration the folder was started with; continuable options may change."""
    from coclr.cli import main

    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    run_dir = tmp_path / "run"
    base = [f"data.store={store}", f"run.out={run_dir}", *TINY, "pipeline.infonce_epochs=1",
            "pipeline.cycle_epochs=1", "pipeline.cycles=1"]
    assert main(["pipeline", *base, "--until", "infonce_rgb"]) == 0
    assert ("stopped before the end: infonce_flow, cycle1_rgb, cycle1_flow not finished; the same command without "
            "--until or run.max_steps continues") in capsys.readouterr().out  # (it said nothing of it)
    manifest = (run_dir / "manifest.json").read_text()
    with pytest.raises(ConfigError, match=r"model\.width=0\.125 \(given 0\.25\), method\.topk=2 \(given 3\)"):
        run_pipeline(pipeline_config(store, run_dir, "model.width=0.25", "method.topk=3"))
    assert (run_dir / "manifest.json").read_text() == manifest and not (run_dir / "infonce_flow").exists()
    assert main(["pipeline", *[o for o in base if not o.startswith(("run.progress=", "data.workers="))],
                 "run.progress=true", "data.workers=1", "--until", "infonce_flow"]) == 0
    recorded = json.loads((run_dir / "manifest.json").read_text())["config"]
    assert recorded["run"]["progress"] is False and recorded["model"]["width"] == 0.125
    # the per-process batch may change, the global batch may not (the stages not started took it in silence)
    batch = next(o for o in base if o.startswith("run.batch_size=")).split("=")[1]
    with pytest.raises(ConfigError, match=rf"run\.batch_size x processes={batch} \(given 2\)"):
        run_pipeline(pipeline_config(store, run_dir, "run.batch_size=2"))
    assert recorded["run"]["global_batch"] == int(batch)


def test_a_finished_stages_lost_encoder_is_written_again_or_refused_before_any_stage(tmp_path: Path) -> None:
    """A finished stage's deleted folder was found only after the next stage had trained, by the one after it, in
    an error naming method.init_checkpoint (an option the pipeline sets itself)."""
    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    run_dir = tmp_path / "run"
    config = pipeline_config(store, run_dir, "pipeline.infonce_epochs=1", "pipeline.cycle_epochs=1")
    run_pipeline(config, until="infonce_rgb")
    encoder = run_dir / "infonce_rgb" / "encoder_rgb.pth"
    kept = encoder.read_bytes()
    encoder.unlink()  # its checkpoint is there: written again as the stage wrote it
    run_pipeline(config, until="infonce_flow")
    assert encoder.read_bytes() == kept and (run_dir / "infonce_flow" / "encoder_flow.pth").is_file()
    shutil.rmtree(run_dir / "infonce_rgb")
    with pytest.raises(ConfigError, match=r"stage infonce_rgb is recorded finished, but .*encoder_rgb\.pth and its "
                                          r"checkpoint are gone: put them back, or --restart"):
        run_pipeline(config, until="cycle1_rgb")
    assert not (run_dir / "cycle1_rgb").exists()


@pytest.mark.slow
def test_a_pipeline_prints_each_stage_and_the_time_left(tmp_path: Path, capsys) -> None:
    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    run_pipeline(pipeline_config(store, tmp_path / "run"))
    out = capsys.readouterr().out
    assert "stage 1/4: infonce_rgb (infonce on rgb, 1 epochs); 0/4 epochs of the pipeline done" in out
    assert "stage 4/4: cycle1_flow (coclr on flow, 1 epochs); 3/4 epochs of the pipeline done, about" in out


@pytest.mark.slow
def test_a_pipeline_can_start_its_cycles_from_another_ones_infonce_stages(tmp_path: Path) -> None:
    """Ablations (K=1, K=50, sim) share one InfoNCE initialisation: their pipelines train only the cycles."""
    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    main_run = tmp_path / "main"
    with pytest.raises(ConfigError, match=r"pipeline\.infonce_from: .*main has no finished InfoNCE stage"):
        run_pipeline(pipeline_config(store, tmp_path / "k1", f"pipeline.infonce_from={main_run}"))
    assert not (tmp_path / "k1").exists()
    run_pipeline(pipeline_config(store, main_run), until="infonce_flow")
    run_dir = run_pipeline(pipeline_config(store, tmp_path / "k1", f"pipeline.infonce_from={main_run}",
                                           "method.topk=1"), until="cycle1_rgb")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [(s["name"], s["status"]) for s in manifest["stages"]] == [("cycle1_rgb", "done"),
                                                                       ("cycle1_flow", "pending")]
    config = torch.load(run_dir / "cycle1_rgb" / "checkpoint_last.pth", weights_only=True)["config"]["method"]
    assert config["init_checkpoint"] == str(main_run / "infonce_rgb" / "encoder_rgb.pth")
    assert config["sampler_checkpoint"] == str(main_run / "infonce_flow" / "encoder_flow.pth")
    assert config["topk"] == 1 and not (tmp_path / "k1" / "infonce_rgb").exists()


def test_a_coclr_stage_that_would_only_fill_its_queue_is_refused_before_any_stage(tmp_path: Path) -> None:
    """CoCLR takes no step until its queue is full (as the authors' code): a stage whose iterations all go to
    filling it would hand on its starting encoder as if it had trained. 8 videos in batches of 4 are 2 iterations
    an epoch; a queue of 8 fills after 2: one epoch trains nothing, two train. Refused before the InfoNCE stages,
    naming the stage and the options; the trainer refuses such a run on its own too, before writing."""
    from coclr.train.run import pretrain
    from test_train import tiny_config

    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    waits = ["method.wait_for_full_queue=null"]  # as the method does: CoCLR waits, InfoNCE does not
    with pytest.raises(ConfigError, match=r"^stage cycle1_rgb: method\.queue_size=8: coclr takes no optimiser step "
                                          r"until its queue is full, after 2 iterations of 4 clips, and this run has 2 "
                                          r"\(1 epoch\(s\) of 2\): .*raise pipeline\.cycle_epochs$"):
        run_pipeline(pipeline_config(store, tmp_path / "run", *waits))
    assert not (tmp_path / "run").exists()
    run_pipeline(pipeline_config(store, tmp_path / "run", *waits), until="infonce_flow")  # those stages train
    stage = tiny_config(store, tmp_path / "stage", "method.name=coclr", "data.view=rgb", "data.second_view=flow",
                        "method.simultaneous=true", "optim.epochs=1", *waits)
    with pytest.raises(ConfigError, match=r"^method\.queue_size=8: .*raise optim\.epochs$"):
        pretrain(stage)
    assert not (tmp_path / "stage").exists()
    run_dir = run_pipeline(pipeline_config(store, tmp_path / "run2", *waits, "pipeline.cycle_epochs=2"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert all(s["status"] == "done" for s in manifest["stages"])
    trained = load_encoder(run_dir / "cycle1_rgb" / "encoder_rgb.pth")[0].state_dict()
    start = load_encoder(run_dir / "infonce_rgb" / "encoder_rgb.pth")[0].state_dict()
    assert any(not torch.equal(trained[k], start[k]) for k in trained if trained[k].is_floating_point()
               and not k.endswith(("running_mean", "running_var")))  # its weights took steps


def test_stretches_of_videos_count_as_instances_in_the_check_before_the_stages(tmp_path: Path) -> None:
    """With ``data.segment_frames`` a stage's instances are stretches of the videos: 4 videos of 64 frames are 12
    instances of 20 frames or more, a batch of 8; the check before the first stage does not count them as 4 videos
    (it would refuse a run that trains), and the trainer counts them."""
    store = make_random_store(tmp_path / "store", videos=4, frames=64)
    config = pipeline_config(store, tmp_path / "run", "data.segment_frames=20", "run.batch_size=8",
                             "method.wait_for_full_queue=null", "pipeline.cycle_epochs=2")
    run_dir = run_pipeline(config)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert all(s["status"] == "done" for s in manifest["stages"])
    records = [json.loads(line) for line in (run_dir / "cycle1_rgb" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "epoch_loss" in r] == [1, 2]  # one batch of the 12 instances an epoch


def test_the_time_left_counts_an_epoch_of_both_views_as_two(tmp_path: Path) -> None:
    """A sim stage's epoch trains both views: the ETA priced it as one view's (about half the time it took); each
    method's epochs at their own time."""
    from coclr.train.pipeline import Stage, pipeline_eta

    stages = [Stage("infonce_rgb", "infonce", ["rgb"], 0, 2, []), Stage("infonce_flow", "infonce", ["flow"], 0, 2, []),
              Stage("cycle1_sim", "coclr", ["rgb", "flow"], 1, 4, [])]
    (tmp_path / "infonce_rgb").mkdir()
    (tmp_path / "infonce_rgb" / "log.jsonl").write_text("".join(json.dumps({"epoch": e, "epoch_seconds": 5.0}) + "\n"
                                                                for e in (1, 2)))
    assert pipeline_eta(tmp_path, stages) == ("2/8 epochs of the pipeline done, about 50 s left (coclr epochs not "
                                              "timed yet: taken at the others')")  # (2 + 4 x 2) x 5
    # a CoCLR epoch timed: its stages at its own time (it cost more than InfoNCE's, and the ETA fell short), and
    # --until counts only the stages up to it (it gave the whole pipeline's time)
    (tmp_path / "cycle1_sim").mkdir()
    (tmp_path / "cycle1_sim" / "log.jsonl").write_text(json.dumps({"epoch": 1, "epoch_seconds": 16.0}) + "\n")
    assert pipeline_eta(tmp_path, stages) == "3/8 epochs of the pipeline done, about 58 s left"  # 2 x 5 + 3 x 16
    assert pipeline_eta(tmp_path, stages, "infonce_flow") == "2/4 epochs up to infonce_flow done, about 10 s left"


def test_a_pipeline_folder_recorded_before_its_global_batch_was_continues() -> None:
    """A folder whose record lacks run.global_batch (written by the version before) was refused as
    "run.batch_size x processes=null (given 4)": the later key is compared only where it is recorded."""
    from coclr.train.pipeline import PIPELINE_FOLDER

    assert PIPELINE_FOLDER.differing({"run": {"batch_size": 8}}, {"run": {"batch_size": 8, "global_batch": 8}}) == []
    assert PIPELINE_FOLDER.differing({"run": {"batch_size": 4, "global_batch": 4}},
                                     {"run": {"batch_size": 8, "global_batch": 8}}) == [
        "run.batch_size x processes=4 (given 8)"]


def test_what_a_later_stage_would_refuse_is_refused_before_the_first_trains_or_the_folder_is_claimed(
        tmp_path: Path) -> None:
    """A store without the flow view: InfoNCE on RGB trained to its end before the flow stage said so (300 epochs
    at the paper's settings); an init of another width was refused by the first stage naming method.init_checkpoint,
    after run.json recorded the mistaken options, so that the mended command was refused; a split with no video was
    "0 training videos, lower run.batch_size"; --restart with options a stage refuses moved the run aside first."""
    from coclr.train.run import pretrain
    from test_train import tiny_config

    rgb_only = make_random_store(tmp_path / "rgb_only", videos=8, frames=10, views=("rgb",))
    with pytest.raises(CoclrError, match=r"view 'flow' is missing for 8 of the 8 'train' videos"):
        run_pipeline(pipeline_config(rgb_only, tmp_path / "p1"))
    assert not (tmp_path / "p1").exists()
    store = make_random_store(tmp_path / "store", videos=8, frames=10)
    with pytest.raises(CoclrError, match=r"split 'val' has no videos \(splits present: train\)"):
        run_pipeline(pipeline_config(store, tmp_path / "p2", "data.split=val"))
    assert not (tmp_path / "p2").exists()
    wide = pretrain(tiny_config(store, tmp_path / "wide", "model.width=0.25", "run.max_steps=1")).checkpoint
    with pytest.raises(CoclrError, match=r"^pipeline\.init: .* holds another encoder than the run's: "
                                         r"model\.width=0\.125 \(the checkpoint: 0\.25\)"):
        run_pipeline(pipeline_config(store, tmp_path / "p3", f"pipeline.init={wide}"))
    assert not (tmp_path / "p3").exists()
    config = pipeline_config(store, tmp_path / "p4")
    run_pipeline(config, until="infonce_rgb")
    kept = (tmp_path / "p4" / "manifest.json").read_bytes()
    with pytest.raises(CoclrError, match=r"pipeline\.init: .* holds another encoder"):
        run_pipeline(pipeline_config(store, tmp_path / "p4", f"pipeline.init={wide}"), until="infonce_rgb",
                     restart=True)
    assert (tmp_path / "p4" / "manifest.json").read_bytes() == kept and not list(tmp_path.glob("p4.replaced-*"))
    run_pipeline(config, until="infonce_rgb", restart=True)  # (a restart that is not refused still moves it)
    assert len(list(tmp_path.glob("p4.replaced-*"))) == 1
    from dataclasses import replace

    stage = stage_config(config, plan_stages(config)[0], tmp_path / "p4")  # a stage given other options by hand:
    with pytest.raises(CoclrError, match=r"optim\.lr=.*part of `coclr pipeline`'s output .*p4: restart that "
                                         r"command to start over$"):  # --restart, which it advised, is refused there
        pretrain(replace(stage, optim=replace(stage.optim, lr=stage.optim.lr * 2)))


def test_a_warm_up_is_checked_against_the_stages_epochs() -> None:
    """A pipeline checked the warm-up against optim.epochs (300), which it never reads: a warm-up of 350 in stages of
    400 was refused, naming an option the pipeline refuses, and one longer than its stages was cut to them without a
    word."""
    from coclr.train.config import PretrainConfig

    needed = ["data.store=s", "run.out=o"]

    long = load_config(PipelineConfig, overrides=[*needed, "pipeline.infonce_epochs=400", "pipeline.cycle_epochs=400",
                                                   "optim.warmup_epochs=350"])
    assert long.optim.warmup_epochs == 350
    with pytest.raises(ConfigError, match=r"^optim\.warmup_epochs: must lie in 0\.\.2, the epochs of the pipeline's "
                       r"shortest stages \(pipeline\.cycle_epochs\): it counts within each stage$"):
        load_config(PipelineConfig, overrides=[*needed, "pipeline.infonce_epochs=4", "pipeline.cycle_epochs=2",
                                               "optim.warmup_epochs=3"])
    sim = load_config(PipelineConfig, overrides=[*needed, "pipeline.infonce_epochs=8", "pipeline.cycle_epochs=2",
                                                 "pipeline.mode=sim", "optim.warmup_epochs=3"])  # (stages of 4)
    assert sim.optim.warmup_epochs == 3
    with pytest.raises(ConfigError, match=r"^optim\.warmup_epochs: must lie in 0\.\.optim\.epochs \(3\)$"):
        load_config(PretrainConfig, overrides=[*needed, "optim.epochs=3", "optim.warmup_epochs=5",
                                               "optim.milestones=[]"])


def test_a_temperature_too_small_to_train_is_refused_before_any_work() -> None:
    """1e-38 trained an epoch at a loss of 3e36, then stopped at NaN with a hint of optim.lr; 1e-30 "finished"."""
    from coclr.train.config import PretrainConfig

    for value in ("1e-38", "0.0005"):
        with pytest.raises(ConfigError, match=r"^method\.temperature: must be at least 0\.001 \(the paper's is "
                           r"0\.07\), got "):
            load_config(PretrainConfig, overrides=["data.store=s", "run.out=o", f"method.temperature={value}"])
    assert load_config(PretrainConfig, overrides=["data.store=s", "run.out=o", "method.temperature=0.001"]
                       ).method.temperature == 0.001
