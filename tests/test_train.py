"""Pretraining: bad configurations fail before compute, exact resume after SIGKILL, order of the data."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from coclr.config import load_config
from coclr.errors import CheckpointError, ConfigError, DataError
from coclr.train.checkpoint import load_checkpoint
from coclr.train.config import PipelineConfig, PretrainConfig
from coclr.train.run import pretrain
from coclr.train.sampler import ResumableSampler
from coclr.train.trainer import LAST
from conftest import REPO_ROOT, make_random_store

TINY = ["model.width=0.125", "data.length=8", "data.size=32", "data.workers=0", "method.queue_size=8",
        "method.topk=2", "method.wait_for_full_queue=false", "run.batch_size=4", "run.progress=false",
        "run.log_every=1", "run.deterministic=true"]


def with_options(args: list[str], *overrides: str) -> list[str]:
    """``args`` with ``overrides`` in place of the same keys' values (a command line gives each option once)."""
    keys = {override.partition("=")[0] for override in overrides}
    return [arg for arg in args if arg.partition("=")[0] not in keys] + list(overrides)


def tiny_config(store: Path, out: Path, *overrides: str) -> PretrainConfig:
    return load_config(PretrainConfig, None, [f"data.store={store}", f"run.out={out}", *TINY, *overrides])


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_random_store(tmp_path / "store")


# ------------------------------------------------------------------------------------ bad configuration

@pytest.mark.parametrize("overrides, key", [
    (["method.name=coclr", "method.sampler_checkpoint=m.pth", "method.queue_size=8", "method.topk=8"],
     "method.topk"),
    (["method.name=coclr"], "method.sampler_checkpoint"),
    (["method.tpok=3"], "method.tpok"),
    (["optim.lr=-1"], "optim.lr"),
    (["data.size=16"], "data.size"),
    (["data.length=4"], "data.length"),
    (["method.name=supervised"], "method.name"),
    (["optim.epochs=10", "optim.milestones=[20]"], "optim.milestones"),
    (["optim.epochs=10", "optim.milestones=[5, 5]"],  # (the lr was cut to a hundredth at epoch 5)
     r"optim.milestones: \[5, 5\] gives epoch 5 more than once"),
    (["optim.epochs=10", "optim.warmup_epochs=11"], "optim.warmup_epochs"),
    (["optim.warmup_epochs=-1"], "optim.warmup_epochs"),
    (["optim.epochs=-3"], "optim.epochs: must be at least 1, got -3"),
    (["method.own_positive_epochs=-1"], "method.own_positive_epochs"),
    (["method.name=cmc", "data.second_view=rgb"], "data.second_view"),
    (["run.batch_size=1", "data.length=12", "data.size=48"],
     "run.batch_size: 1: batch-norm in training needs two values per channel, and clips of 12x48x48 leave one "
     "position in S3D's last feature map; give run.batch_size of at least 2, or data.length of at least 13 or "
     "data.size of at least 49$"),
])
def test_bad_options_name_their_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(PretrainConfig, None, ["data.store=s", "run.out=o", *overrides])


def test_one_clip_a_batch_trains_where_the_last_feature_map_has_two_positions() -> None:
    from coclr.clips import feature_map_size
    from coclr.models.s3d import S3D

    network = S3D(width=0.125).eval()
    for shape in ((8, 32, 32), (15, 63, 40), (16, 32, 32), (13, 100, 37), (9, 64, 33)):
        with torch.no_grad():
            assert tuple(network(torch.zeros(1, 3, *shape)).shape[2:]) == feature_map_size(*shape)
    for overrides in (["data.length=13", "data.size=32"], ["data.length=8", "data.size=49"]):
        load_config(PretrainConfig, None, ["data.store=s", "run.out=o", "run.batch_size=1", *overrides])


def test_missing_store_fails_before_compute(tmp_path: Path) -> None:
    config = tiny_config(tmp_path / "nowhere", tmp_path / "run")
    with pytest.raises(ConfigError, match="data.store"):
        pretrain(config)


def test_coclr_without_the_second_views_data(tmp_path: Path) -> None:
    store = make_random_store(tmp_path / "store", views=("rgb",))
    sampler = tmp_path / "sampler.pth"
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    save_encoder(sampler, build_encoder(width=0.125))
    config = tiny_config(store, tmp_path / "run", "method.name=coclr", f"method.sampler_checkpoint={sampler}")
    with pytest.raises(DataError, match="'flow' view"):
        pretrain(config)


def test_coclr_with_a_missing_sampler_checkpoint(store: Path, tmp_path: Path) -> None:
    config = tiny_config(store, tmp_path / "run", "method.name=coclr",
                         f"method.sampler_checkpoint={tmp_path / 'missing.pth'}")
    with pytest.raises(CheckpointError, match="method.sampler_checkpoint: checkpoint not found"):
        pretrain(config)
    config = tiny_config(store, tmp_path / "run", "method.name=coclr", f"method.sampler_checkpoint={tmp_path}")
    with pytest.raises(CheckpointError, match="sampler_checkpoint: .* is a folder, not a checkpoint file"):
        pretrain(config)


def test_cli_reports_bad_config_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "coclr", "pretrain", "data.store=x", f"run.out={tmp_path}",
                             "method.name=coclr", "method.sampler_checkpoint=m.pth", "method.topk=9999"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "method.topk" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path: Path) -> None:
    from coclr.study.config import StudyConfig

    config_class = (StudyConfig if path.name.startswith("study_") else PipelineConfig if "pipeline" in path.name
                    else PretrainConfig)
    load_config(config_class, path)


# ------------------------------------------------------------------------------------------ data order

def test_sampler_resumes_mid_epoch_on_any_world_size() -> None:
    full = list(ResumableSampler(40, 4, seed=3))
    assert sorted(full) == list(range(40))
    resumed = ResumableSampler(40, 4, seed=3)
    resumed.set_epoch(0, consumed=12)
    assert list(resumed) == full[12:]
    # Two processes: each takes its contiguous half of every global batch of 8.
    ranks = [ResumableSampler(40, 4, seed=3, rank=r, world_size=2) for r in range(2)]
    for sampler in ranks:
        sampler.set_epoch(0, consumed=8)
    per_rank = [list(s) for s in ranks]
    global_order = [i for batch in range(4) for r in range(2) for i in per_rank[r][batch * 4:(batch + 1) * 4]]
    assert global_order == full[8:]


def test_epochs_differ_and_repeat(tmp_path: Path) -> None:
    sampler = ResumableSampler(20, 2, seed=1)
    sampler.set_epoch(1)
    first = list(sampler)
    sampler.set_epoch(2)
    assert list(sampler) != first
    sampler.set_epoch(1)
    assert list(sampler) == first


# --------------------------------------------------------------------------------------- kill and resume

def run_pretrain(args: list[str], kill_in_step: int | None = None) -> subprocess.Popen:
    """``coclr pretrain ARGS`` in a subprocess; with ``kill_in_step``, the process SIGKILLs itself inside that
    iteration (1-based), after its optimizer step and before its bookkeeping or any save, so the kill falls at
    the same point of the run however fast or loaded the machine is."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = "import sys; from coclr.cli import main; sys.exit(main(sys.argv[1:]))"
    if kill_in_step is not None:
        code = KILL_IN_STEP.format(step=kill_in_step) + code
    return subprocess.Popen([sys.executable, "-c", code, "pretrain", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


KILL_IN_STEP = """
import os, signal
from coclr.train.trainer import LAST, Trainer
_train_step = Trainer.train_step
def _killing_step(self, *args, **kwargs):
    result = _train_step(self, *args, **kwargs)
    if self.position.global_step + 1 == {step}:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
Trainer.train_step = _killing_step
"""


def model_state(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def test_sigkill_mid_epoch_then_resume_matches_uninterrupted(store: Path, tmp_path: Path) -> None:
    # The kill falls inside the lr warm-up (6 iterations), so resuming must also continue it exactly.
    common = [f"data.store={store}", *TINY, "optim.epochs=3", "optim.warmup_epochs=2", "run.save_every=1"]
    reference = run_pretrain([*common, f"run.out={tmp_path / 'a'}"])
    interrupted = run_pretrain([*common, f"run.out={tmp_path / 'b'}"], kill_in_step=6)  # epoch 2 of 3
    out_interrupted, _ = interrupted.communicate(timeout=300)
    assert interrupted.returncode == -signal.SIGKILL, out_interrupted
    last = tmp_path / "b" / "checkpoint_last.pth"
    killed_at = load_checkpoint(last)["position"]
    assert (killed_at["epoch"], killed_at["global_step"]) == (1, 5), killed_at  # saved after step 5, mid-epoch
    resumed = run_pretrain([*common, f"run.out={tmp_path / 'b'}"])  # the same command continues
    out_resumed, _ = resumed.communicate(timeout=300)
    out_reference, _ = reference.communicate(timeout=300)
    assert resumed.returncode == 0, out_resumed
    assert reference.returncode == 0, out_reference
    assert "resumed from" in out_resumed
    a, b = model_state(tmp_path / "a" / "checkpoint_last.pth"), model_state(last)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert load_checkpoint(last)["position"] == load_checkpoint(tmp_path / "a" / "checkpoint_last.pth")["position"]


def test_checkpoint_holds_the_full_state_and_loads_as_an_encoder(store: Path, tmp_path: Path, start_trainer) -> None:
    from coclr.models.loading import load_encoder

    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=1"))
    last = trainer.run()
    state = load_checkpoint(last)
    for key in ("model", "optimizer", "scheduler", "scaler", "rng", "position", "config"):
        assert key in state
    assert "learners.rgb.queue.full" in state["model"]
    assert any(k.startswith("learners.rgb.encoder_k.") for k in state["model"])
    backbone, head = load_encoder(last)
    encoder = trainer.model.learners["rgb"].encoder_q
    for name, value in encoder.backbone.state_dict().items():
        assert torch.equal(backbone.state_dict()[name], value)
    assert head is not None
    log = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    assert len(log) >= 3 and '"loss"' in log[0] and '"lr"' in log[0]
    assert (tmp_path / "run" / "tb").is_dir()


def test_resuming_drops_a_log_line_a_kill_cut_short(store: Path, tmp_path: Path) -> None:
    pretrain(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.max_steps=3"))  # stops after epoch 1
    log = tmp_path / "run" / "log.jsonl"
    written = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text(log.read_text() + '{"step": 99, "loss": 1.')  # killed while appending a record
    pretrain(tiny_config(store, tmp_path / "run", "optim.epochs=2"))
    records = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON again
    assert records[:len(written)] == written
    assert [r["epoch"] for r in records if "epoch_loss" in r] == [1, 2]
    assert all(r["step"] != 99 for r in records)


def test_best_checkpoint_is_the_epoch_with_the_lowest_loss(store: Path, tmp_path: Path, start_trainer) -> None:
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=4"))
    last = trainer.run()
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    losses = [r["epoch_loss"] for r in records if "epoch_loss" in r]
    assert len(losses) == 4
    best = load_checkpoint(tmp_path / "run" / "checkpoint_best.pth")
    assert best["position"]["epoch"] == losses.index(min(losses)) + 1
    assert best["best_loss"] == pytest.approx(min(losses))
    assert load_checkpoint(last)["position"]["epoch"] == 4


def test_the_time_left_is_the_steps_left_at_the_recent_epochs_pace() -> None:
    from coclr.train.trainer import RECENT_EPOCHS, run_left

    assert run_left([], 10, 0, 5, 0, 0, 0) is None  # nothing timed yet: no figure rather than a guess
    assert run_left([2.0], 10, 3, 5, 4, 34, 0) == (2 * 10 - 4) * 2.0  # the rest of this epoch and the next
    assert run_left([2.0], 10, 3, 5, 4, 34, 40) == 6 * 2.0  # max_steps ends the run first
    slow_start = [9.0] + [1.0] * RECENT_EPOCHS
    assert run_left(slow_start, 10, 6, 8, 0, 60, 0) == 20 * 1.0  # the first epoch's warm-up no longer counts
    assert run_left([1.0], 10, 5, 5, 0, 50, 0) == 0.0
    # The kNN monitor after every 2nd epoch (it was left out: "about 1 s left" where 2.8 s were): in epoch 4 of 9,
    # checks after epochs 4, 6 and 8 are left; max_steps=65 ends the run in epoch 7, after the checks of 4 and 6.
    assert run_left([1.0], 10, 3, 9, 0, 30, 0, [5.0], 2) == 60 * 1.0 + 3 * 5.0
    assert run_left([1.0], 10, 3, 9, 0, 30, 65, [5.0], 2) == 35 * 1.0 + 2 * 5.0
    assert run_left([1.0], 10, 3, 9, 0, 30, 0, [], 2) == 60 * 1.0  # (no check timed yet)


def test_each_epoch_says_how_long_the_run_has_left(store: Path, tmp_path: Path, start_trainer, capsys) -> None:
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=3"))
    trainer.run()
    lines = [line for line in capsys.readouterr().out.splitlines() if re.search(r"\] epoch \d/3: ", line)]
    assert len(lines) == 3 and "left" not in lines[-1] and lines[-1].endswith(" s)")  # the last: nothing left
    first = float(re.search(r"\(([\d.]+) s, about (\d+) s left\)", lines[0]).group(1))
    left = int(re.search(r"about (\d+) s left", lines[0]).group(1))
    assert abs(left - 2 * first) <= 1 + 0.01 * first  # two more epochs of as many steps, at the first one's pace


def test_rgbdiff_view_trains_from_rgb_frames(tmp_path: Path, start_trainer) -> None:
    store = make_random_store(tmp_path / "store", frames=12, views=("rgb",))
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "data.view=rgbdiff", "data.second_view=rgb",
                                        "run.max_steps=1"))
    batch = trainer.dataset[0]
    assert batch["rgbdiff"].shape[1] == 9  # T + 1 RGB frames, differenced into T after augmentation
    trainer.run()
    assert load_checkpoint(tmp_path / "run" / "checkpoint_last.pth")["position"]["global_step"] == 1


def test_knn_recall_is_logged_when_the_store_has_labelled_splits(tmp_path: Path) -> None:
    store = make_random_store(tmp_path / "store", test_videos=6)
    pretrain(tiny_config(store, tmp_path / "run", "optim.epochs=1", "run.knn_every=1"))
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    knn = [r for r in records if "knn_R@1" in r]
    assert len(knn) == 1 and 0 <= knn[0]["knn_R@1"] <= 100


def test_a_nonfinite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(store: Path, tmp_path: Path,
                                                                            start_trainer) -> None:
    from coclr.train.trainer import NonFiniteLossError

    # An absurd learning rate blows the weights up after the first step: the next loss is not finite.
    exploding = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=3", "optim.lr=1e30",
                                          "run.save_every=1"))
    with pytest.raises(NonFiniteLossError, match="NaN or infinite.*the last good checkpoint is kept in .*"
                                                 "checkpoint_last.pth"):
        exploding.run()
    kept = load_checkpoint(tmp_path / "run" / "checkpoint_last.pth")
    assert 1 <= kept["position"]["global_step"] < exploding.position.global_step
    logged = [json.loads(line)["loss"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert logged and all(math.isfinite(loss) for loss in logged)


def test_a_loss_nonfinite_before_any_checkpoint_names_none(store: Path, tmp_path: Path, start_trainer) -> None:
    """Non-finite from the first steps (an init checkpoint of NaN weights, say): the message named a last good
    checkpoint that was never written."""
    from coclr.train.trainer import NonFiniteLossError

    exploding = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=3", "optim.lr=1e30"))
    with pytest.raises(NonFiniteLossError, match=r"stopped, no checkpoint was saved yet \(try a lower optim\.lr"):
        exploding.run()
    assert not (tmp_path / "run" / "checkpoint_last.pth").exists()


def test_a_run_that_continues_on_other_videos_says_it(store: Path, tmp_path: Path) -> None:
    """A video found damaged after a checkpoint is left out when the run continues: its epochs then have other
    orders and step counts than the uninterrupted run's, and nothing said so."""
    from coclr.train.run import pretrain

    config = tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.max_steps=1")
    pretrain(config)
    path = tmp_path / "run" / "checkpoint_last.pth"
    state = torch.load(path, weights_only=True)
    videos = state["videos"]
    assert videos > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pretrain(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.max_steps=2"))  # the same videos: silent
    state = torch.load(path, weights_only=True)
    state["videos"] = videos + 1  # as if one video were left out since
    torch.save(state, path)
    with pytest.warns(UserWarning, match=rf"trained on {videos + 1} instances and continues on {videos} \(videos "
                                         "left out.*not those of the run it would have been uninterrupted"):
        pretrain(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.max_steps=3"))
    state = torch.load(path, weights_only=True)
    state["videos"] = videos - 1  # more now: not "left out" (a store grown or replaced)
    torch.save(state, path)
    with pytest.warns(UserWarning, match=rf"trained on {videos - 1} instances and continues on {videos} \(videos "
                                         r"added to the store since, or the store replaced\)"):
        pretrain(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.max_steps=4"))


def test_a_queue_as_large_as_the_store_is_warned_once(store: Path, tmp_path: Path) -> None:
    """A queue of at least as many keys as the store has instances (the default 2048 on a few dozen videos) holds
    every query's own earlier keys as negatives from the second epoch on: it was started without a word. Said when
    the run starts, not when it continues; UberNCE's positives are labels, so its own video is a positive."""
    from coclr.train.run import pretrain

    with pytest.warns(UserWarning, match=r"method.queue_size=12 is not smaller than the 12 training instance\(s\)"
                                         r".*\(method.queue_size=4\) avoids it"):
        pretrain(tiny_config(store, tmp_path / "run", "method.queue_size=12", "run.max_steps=1"))
    from coclr.train.setup import warn_queue_of_own_keys

    coclr = tiny_config(store, tmp_path / "x", "method.name=coclr", "method.sampler_checkpoint=m.pth",
                        "method.queue_size=12", "method.topk=5")
    with pytest.warns(UserWarning, match=r"\(method.queue_size=6\) avoids it"):  # (4 holds no top-5)
        warn_queue_of_own_keys(coclr, 12)
    with pytest.warns(UserWarning, match=r"more videos \(or stretches of them: data.segment_frames\) avoid it"):
        warn_queue_of_own_keys(coclr, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pretrain(tiny_config(store, tmp_path / "run", "method.queue_size=12", "run.max_steps=2"))  # continues
        pretrain(tiny_config(store, tmp_path / "under", "method.queue_size=11", "run.max_steps=1"))
        pretrain(tiny_config(store, tmp_path / "labels", "method.name=ubernce", "method.queue_size=12",
                             "run.max_steps=1"))


def test_instances_shorter_than_a_clip_are_said_and_counted_as_instances(store, tmp_path, capsys):
    """data.length past every video's frames, or data.segment_frames of one frame: every clip repeated its last
    frame (both clips of an instance the same frames) without a word, and the log said "352 videos" of 32."""
    from coclr.train.run import pretrain

    with pytest.warns(UserWarning, match=r"12 of the 12 training instances \(videos\) have fewer frames than a clip "
                                         r"spans \(16: data\.length=16, data\.stride=1\).*lower data\.length"):
        pretrain(tiny_config(store, tmp_path / "long", "data.length=16", "run.max_steps=1"))
    with pytest.warns(UserWarning, match=r"132 of the 132 training instances \(stretches of data\.segment_frames=1\) .*"
                                         r"\(or raise data\.segment_frames\)"):
        pretrain(tiny_config(store, tmp_path / "cut", "data.segment_frames=1", "run.max_steps=1"))
    assert "132 instances (12 videos in stretches)" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pretrain(tiny_config(store, tmp_path / "fits", "data.segment_frames=8", "run.max_steps=1"))


def test_a_warm_up_that_the_queue_s_filling_pushes_past_the_end_is_said(store, tmp_path):
    """Counted from the first optimiser step, the warm-up of a CoCLR run starts once the queue is full: with
    optim.warmup_epochs close to optim.epochs it never ended (the lr below its schedule to the last step), though
    the option's check (at most the epochs) promised it would."""
    from coclr.train.setup import warn_warmup_past_the_end

    coclr = tiny_config(tmp_path / "store", tmp_path / "x", "method.name=coclr", "method.sampler_checkpoint=m.pth",
                        "method.queue_size=12", "method.topk=1", "method.wait_for_full_queue=true", "optim.epochs=4",
                        "optim.warmup_epochs=3.5")
    # 4 iterations an epoch of 4 clips: the queue fills in 3, the warm-up needs 14 more, the run has 16
    with pytest.warns(UserWarning, match=r"optim.warmup_epochs=3.5: .* after the 3 iteration\(s\) that fill the "
                                         r"queue .* last iteration \(16\).*optim.warmup_epochs=3.25 or less"):
        warn_warmup_past_the_end(coclr, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coclr.optim.warmup_epochs = 3.25  # ends on the last iteration
        warn_warmup_past_the_end(coclr, 4, 4)
        infonce = tiny_config(tmp_path / "store", tmp_path / "y", "optim.epochs=4", "optim.warmup_epochs=4")
        warn_warmup_past_the_end(infonce, 4, 4)  # (no wait: its warm-up starts at once)
    from coclr.train.run import pretrain

    with pytest.warns(UserWarning, match=r"optim.warmup_epochs=1: the warm-up starts at the first optimiser step"):
        pretrain(tiny_config(store, tmp_path / "run", "method.wait_for_full_queue=true", "optim.epochs=1",
                             "optim.warmup_epochs=1", "run.max_steps=1"))  # (the run says it as it starts)


def test_cmc_trains_both_views_against_each_other(store: Path, tmp_path: Path, start_trainer) -> None:
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "method.name=cmc", "run.max_steps=2"))
    assert set(trainer.model.learners) == {"rgb", "flow"} and trainer.model.sampler is None
    for learner in trainer.model.learners.values():  # the other view's negatives from the first step
        torch.testing.assert_close(learner.queue.other.norm(dim=1), torch.ones(learner.queue.size))
    before = {v: learner.encoder_q.head.fc2.weight.clone() for v, learner in trainer.model.learners.items()}
    trainer.run()
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pth")
    assert set(state["encoders"]) == {"rgb", "flow"}
    for view, learner in trainer.model.learners.items():
        assert not torch.equal(before[view], learner.encoder_q.head.fc2.weight), f"{view} was not trained"
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert {"rgb/loss", "flow/loss"} <= set(records[-1])


@pytest.mark.parametrize("as_negative", [True, False])
def test_a_dropped_own_key_is_a_negative_only_when_asked(as_negative: bool) -> None:
    """CoCLR with the own key always dropped: with ``dropped_own_as_negative`` (reference) the own key's
    similarity still moves the loss through the denominator; without it the loss ignores the own key."""
    import copy

    from coclr.models.encoder import build_encoder
    from coclr.train.learner import Targets, ViewLearner

    torch.manual_seed(0)
    learner = ViewLearner(build_encoder(width=0.125), method="coclr", queue_size=16, temperature=0.07,
                          momentum=0.99, topk=3, own_drop_prob=1.0, group_positives=False, loss_form="mil",
                          dropped_own_as_negative=as_negative)
    batch = 4
    embed = lambda n: torch.nn.functional.normalize(torch.randn(n, 128), dim=1)  # noqa: E731
    learner.queue.enqueue(embed(16), labels=torch.zeros(16, dtype=torch.long), video_ids=torch.arange(16),
                          groups=torch.arange(16), other=embed(16))
    clip = torch.randn(batch, 3, 8, 32, 32)
    targets = Targets(torch.zeros(batch, dtype=torch.long), torch.arange(100, 104), torch.arange(100, 104))
    other = embed(batch)
    with torch.no_grad():
        query = learner.encoder_q(clip)

    def loss(own_keys: torch.Tensor, keep_own: bool = False) -> float:
        fresh = copy.deepcopy(learner)  # step() enqueues; every call starts from the same queue
        out = fresh.step(clip, own_keys, targets, other, generator=torch.Generator().manual_seed(0),
                         keep_own=keep_own)
        return out.loss.item()

    near, far = query, -query  # own key identical to the query, or opposite to it
    if as_negative:
        assert loss(near) > loss(far) + 1.0
    else:
        assert loss(near) == pytest.approx(loss(far), abs=1e-6)
    # Kept (the first method.own_positive_epochs), the own key is a positive despite own_drop_prob=1.
    assert loss(near, keep_own=True) < loss(far, keep_own=True) - 1.0


def test_the_own_key_is_kept_during_the_first_own_positive_epochs(store: Path, tmp_path: Path, start_trainer) -> None:
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=3", "method.own_positive_epochs=1.5"))
    assert trainer.data_order.batches_per_epoch == 3
    assert [trainer.keeps_own_key(i) for i in range(6)] == [True] * 5 + [False]


@pytest.mark.parametrize("warmup_epochs", [0.0, 2.0])
def test_lr_warm_up_scales_the_first_updates_and_leaves_the_schedule(store: Path, tmp_path: Path,
                                                                     warmup_epochs: float, start_trainer) -> None:
    """Adam's first update moves every weight with a clear gradient by lr (m/sqrt(v) = +-1): with a warm-up
    over 2 epochs of 3 iterations, the first iteration uses lr/6. The scheduled lr is left as it was."""
    lr = 1e-3
    trainer = start_trainer(tiny_config(store, tmp_path / "run", f"optim.lr={lr}", "optim.weight_decay=0",
                                        f"optim.warmup_epochs={warmup_epochs}", "run.max_steps=1"))
    assert trainer.data_order.batches_per_epoch == 3
    encoder = trainer.model.learners["rgb"].encoder_q
    before = {name: p.detach().clone() for name, p in encoder.named_parameters()}
    trainer.run()
    largest = max(float((p.detach() - before[name]).abs().max()) for name, p in encoder.named_parameters())
    expected = lr / 6 if warmup_epochs else lr
    assert expected * 0.99 <= largest <= expected * 1.001
    assert trainer.optimizer.param_groups[0]["lr"] == lr
    logged = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    assert logged["lr"] == pytest.approx(expected)
    assert [trainer.warmup_factor(i) for i in (0, 5, 6, 100)] == ([1 / 6, 1.0, 1.0, 1.0] if warmup_epochs
                                                                  else [1.0] * 4)


def test_the_warm_up_counts_from_the_first_optimiser_step(store: Path, tmp_path: Path) -> None:
    """A run that takes no step until its queue is full (CoCLR) spent its warm-up and own-key epochs on the
    iterations that fill it: the first real step could be at the full lr. Counted from the first step (resumed
    alike), and the iterations without a step log an lr of 0."""
    from coclr.train.run import pretrain

    options = ["optim.lr=1e-3", "optim.epochs=2", "optim.warmup_epochs=1", "method.wait_for_full_queue=true",
               "method.queue_size=8", "run.log_every=1"]  # 3 iterations of 4 clips an epoch; 2 fill the queue

    def lrs(run: Path) -> list[float]:
        return [json.loads(line)["lr"] for line in (run / "log.jsonl").read_text().splitlines() if '"lr"' in line]

    from coclr.train.trainer import Trainer

    asked = []
    keeps = Trainer.keeps_own_key
    Trainer.keeps_own_key = lambda self, iteration: asked.append(iteration) or keeps(self, iteration)
    try:
        pretrain(tiny_config(store, tmp_path / "whole", *options))
    finally:
        Trainer.keeps_own_key = keeps
    assert lrs(tmp_path / "whole") == pytest.approx([0, 0, 1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])
    assert asked == [0, 0, 0, 1, 2, 3]  # the own-key epochs count the optimiser's steps too
    assert load_checkpoint(tmp_path / "whole" / LAST)["position"]["first_step"] == 2
    pretrain(tiny_config(store, tmp_path / "resumed", *options, "run.max_steps=3", "run.save_every=1"))
    pretrain(tiny_config(store, tmp_path / "resumed", *options))
    assert lrs(tmp_path / "resumed") == lrs(tmp_path / "whole")


def test_milestones_multiply_the_lr_by_gamma_from_their_epoch_on(store: Path, tmp_path: Path, start_trainer) -> None:
    """Three epochs of three iterations, milestone at epoch 2: the last epoch's updates use lr x gamma."""
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.lr=1e-3", "optim.epochs=3",
                                        "optim.schedule=milestones", "optim.milestones=[2]", "optim.gamma=0.1",
                                        "run.log_every=1"))
    assert trainer.data_order.batches_per_epoch == 3
    trainer.run()
    steps = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()
             if '"lr"' in line]
    assert [step["lr"] for step in steps] == pytest.approx([1e-3] * 6 + [1e-4] * 3)


def test_the_same_command_continues_and_another_is_refused_naming_each_option(store: Path, tmp_path: Path,
                                                                            capsys) -> None:
    """Rerunning `coclr pretrain` without --resume continues the run; changed options are refused before any
    work, naming each with both values, and nothing in the folder changes; --restart moves the run aside."""
    from coclr.cli import main

    run = tmp_path / "run"
    args = ["pretrain", f"data.store={store}", f"run.out={run}", *TINY, "optim.epochs=2", "run.max_steps=3"]
    assert main(args) == 0  # stops after epoch 1 (3 iterations)
    assert "stopped before the end (run.max_steps=3): the same command without it" in capsys.readouterr().out
    last = run / LAST
    assert load_checkpoint(last)["position"]["epoch"] == 1
    written = {path.name: path.read_bytes() for path in (last, run / "log.jsonl", run / "run.json")}
    changed = with_options([a for a in args if a != "run.max_steps=3"], "optim.lr=0.002", "model.width=0.25")
    assert main(changed) == 2
    assert {path.name: path.read_bytes() for path in (last, run / "log.jsonl", run / "run.json")} == written
    assert main(with_options([a for a in args if a != "run.max_steps=3"], "run.progress=true", "data.workers=1")) == 0
    assert load_checkpoint(last)["position"]["epoch"] == 2  # continued: epoch 2 of 2, not epoch 1 again
    epochs = [json.loads(line)["epoch"] for line in (run / "log.jsonl").read_text().splitlines()
              if "epoch_loss" in line]
    assert epochs == [1, 2]
    assert json.loads((run / "run.json").read_text())["options"]["run"]["progress"] is False  # as started
    events = sorted((run / "tb").iterdir())
    assert main([a for a in args if a != "run.max_steps=3"]) == 0  # finished: nothing to do, and no new (empty)
    assert sorted((run / "tb").iterdir()) == events  # TensorBoard file
    # --restart with options a part refuses (a batch larger than the store): the run was moved aside before the
    # refusal, and run.out left empty
    before = {path.name: path.read_bytes() for path in (last, run / "run.json")}
    assert main([*args, "--restart", "run.batch_size=64"]) == 2
    assert not list(tmp_path.glob("run.replaced-*"))
    assert {path.name: path.read_bytes() for path in (last, run / "run.json")} == before
    assert main([*args, "--restart"]) == 0
    assert len(list(tmp_path.glob("run.replaced-*"))) == 1
    assert load_checkpoint(last)["position"]["epoch"] == 1


def test_an_epoch_resumed_mid_way_has_the_loss_schedule_and_best_of_one_not_stopped(store: Path, tmp_path: Path,
                                                                                     monkeypatch, capsys) -> None:
    """The epoch's loss was the mean of the steps after the resume only (a plateau schedule then cut the lr at
    another epoch, and checkpoint_best named another); stopped after its last step but before its end (a kill
    during the kNN check), the epoch was logged with a loss of 0.0."""
    from coclr.cli import main
    from coclr.train.trainer import Trainer

    args = ["pretrain", f"data.store={store}", *TINY, "optim.epochs=3", "optim.schedule=plateau",
            "optim.patience=0", "run.save_every=1"]

    def log(run: Path) -> tuple[list, list]:
        records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        return ([(r["epoch"], r["epoch_loss"]) for r in records if "epoch_loss" in r],
                [(r["step"], r["lr"]) for r in records if "lr" in r])

    assert main([*args, f"run.out={tmp_path / 'a'}"]) == 0
    assert main([*args, f"run.out={tmp_path / 'b'}", "run.max_steps=2"]) == 0  # stopped mid-way through epoch 1
    capsys.readouterr()
    assert main([*args, f"run.out={tmp_path / 'b'}"]) == 0
    printed = capsys.readouterr()  # counted from 1, as the epochs' lines and an interruption's are
    assert "at epoch 1, 8 videos into it (step 2)" in printed.out + printed.err
    real_end = Trainer._end_epoch
    ends = []

    def stopped_once(self, *rest):
        ends.append(self.position.epoch)
        if len(ends) == 2:  # epoch 2's last step saved, its end not reached
            raise KeyboardInterrupt
        return real_end(self, *rest)

    monkeypatch.setattr(Trainer, "_end_epoch", stopped_once)
    assert main([*args, f"run.out={tmp_path / 'c'}"]) == 130
    assert main([*args, f"run.out={tmp_path / 'c'}"]) == 0
    reference = log(tmp_path / "a")
    assert len(reference[0]) == 3 and all(loss > 0 for _, loss in reference[0])
    for run in ("b", "c"):
        assert log(tmp_path / run) == reference, run
        assert load_checkpoint(tmp_path / run / "checkpoint_best.pth")["position"] == \
            load_checkpoint(tmp_path / "a" / "checkpoint_best.pth")["position"]


def test_a_kill_between_the_best_and_the_last_checkpoint_leaves_a_run_that_ends_with_its_best(
        store: Path, tmp_path: Path, monkeypatch) -> None:
    """The last checkpoint was renamed into place holding the new best loss, then linked as the best: killed between
    the two, the run continued from the last one, and its best checkpoint stayed missing for good."""
    from coclr.cli import main
    from coclr.train import trainer

    args = ["pretrain", f"data.store={store}", *TINY, "optim.epochs=2", "run.save_every=1"]
    assert main([*args, f"run.out={tmp_path / 'a'}"]) == 0

    class Killed(BaseException):
        pass

    def killed(*_):
        raise Killed

    monkeypatch.setattr(trainer, "atomic_duplicate", killed)
    with pytest.raises(Killed):
        main([*args, f"run.out={tmp_path / 'b'}"])
    monkeypatch.undo()
    assert (tmp_path / "b" / "checkpoint_best.pth").is_file()  # (the best first: the last is the one before it)
    assert main([*args, f"run.out={tmp_path / 'b'}"]) == 0
    assert (tmp_path / "b" / "checkpoint_best.pth").is_file()
    for name in ("checkpoint_best.pth", "checkpoint_last.pth"):
        assert load_checkpoint(tmp_path / "b" / name)["position"] == \
            load_checkpoint(tmp_path / "a" / name)["position"], name


def test_a_run_continued_on_other_threads_kernels_or_processes_says_it_drifts(store: Path, tmp_path: Path,
                                                                             capsys) -> None:
    """CPU training's sums are ordered by the thread count (oneDNN's convolutions): a run killed and continued under
    another OMP_NUM_THREADS ended 1,249 tensors away from the uninterrupted run, without a word."""
    import torch

    from coclr.cli import main
    from coclr.cpu import arithmetic_changes

    args = ["pretrain", f"data.store={store}", *TINY, "optim.epochs=2", f"run.out={tmp_path / 'run'}"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert main([*args, "run.max_steps=1"]) == 0
        capsys.readouterr()
        assert main([*args, "run.max_steps=2"]) == 0
        assert "thread" not in capsys.readouterr().err  # the same threads: nothing said
        torch.set_num_threads(2)
        assert main(args) == 0
        said = [line for line in capsys.readouterr().err.splitlines() if "thread" in line]
        torch.set_num_threads(1)
        assert main(args) == 0  # finished: nothing left to train, nothing said (a pipeline loads its done stages)
        assert "thread" not in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)
    assert len(said) == 1 and "the run trained on 1 thread(s) and continues on 2" in said[0]
    assert "OMP_NUM_THREADS=1 continues it exactly" in said[0]
    cpu = {"device": "cpu", "threads": 2, "kernels": "AVX512", "limits": {}}
    emulated = {**cpu, "kernels": "AVX2", "limits": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert arithmetic_changes(cpu, cpu, 2, 2) == [] and arithmetic_changes(None, cpu, None, 1) == []
    assert arithmetic_changes({"device": "cuda"}, {"device": "cuda"}, 1, 1) == []
    changes = arithmetic_changes(cpu, emulated, 2, 1)
    assert len(changes) == 2 and changes[0].startswith("the run trained as 2 process(es) and continues as 1")
    assert "trained with AVX512 kernels and continues with AVX2 (limited: ONEDNN_MAX_CPU_ISA=AVX2)" in changes[1]


def test_a_sampler_that_embeds_every_clip_alike_is_said_to_mine_at_random(store: Path, tmp_path: Path) -> None:
    """A flow checkpoint of two InfoNCE epochs (its BatchNorm statistics not settled) embedded every clip alike: each
    row's top-K were the first queue slots, and two such samplers gave bit-identical runs with normal-looking
    mining figures, without a word."""
    import warnings

    from torch import nn

    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    meta = {"view": "flow", "clip_settings": {"view": "flow", "length": 8}}
    alike = save_encoder(tmp_path / "alike.pth", build_encoder(width=0.125), meta=meta)  # untrained: 1e-7 apart
    spread = build_encoder(width=0.125)
    for module in spread.modules():
        if isinstance(module, (nn.Conv3d, nn.Linear)):
            nn.init.kaiming_normal_(module.weight)  # (clips 0.1 apart)
    spread = save_encoder(tmp_path / "spread.pth", spread, meta=meta)
    said = {}
    for name, sampler in (("alike", alike), ("spread", spread)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pretrain(tiny_config(store, tmp_path / name, "method.name=coclr", f"method.sampler_checkpoint={sampler}",
                                 "optim.epochs=1"))
        said[name] = [str(w.message) for w in caught if "embeds every clip" in str(w.message)]
    assert len(said["alike"]) == 1 and "the positives it mines are arbitrary" in said["alike"][0]
    assert said["spread"] == []


def test_a_refusal_names_every_differing_option(store: Path, tmp_path: Path, capsys) -> None:
    from coclr.cli import main

    base = ["pretrain", f"data.store={store}", f"run.out={tmp_path / 'run'}", *TINY, "optim.epochs=1"]
    assert main(base) == 0
    capsys.readouterr()
    assert main(with_options(base, "optim.lr=0.002", "model.width=0.25")) == 2
    error = capsys.readouterr().err
    assert "model.width=0.125 (given 0.25)" in error and "optim.lr=0.001 (given 0.002)" in error
    assert len(error.strip().splitlines()) == 1
    batch = next(item for item in base if item.startswith("run.batch_size="))
    assert main([*(item for item in base if item != batch), "run.batch_size=3"]) == 2  # (it named run.global_batch)
    error = capsys.readouterr().err
    assert f"run.batch_size x processes={batch.split('=')[1]} (given 3)" in error and "global_batch" not in error


def test_shipped_configs_say_which_milestones_to_change() -> None:
    with pytest.raises(ConfigError, match=r"optim\.milestones: \[200, 250\] must lie in 1\.\.epochs \(2\): when you "
                                          r"change optim\.epochs, set the milestones too"):
        load_config(PretrainConfig, REPO_ROOT / "configs" / "ucf101_infonce.yaml", ["optim.epochs=2"])
    with pytest.raises(ConfigError,
                       match=r"pipeline\.infonce_milestones: \[200, 250\] must lie in 1\.\.infonce_epochs"):
        load_config(PipelineConfig, REPO_ROOT / "configs" / "ucf101_pipeline.yaml", ["pipeline.infonce_epochs=2"])


def test_checkpoints_of_another_width_or_view_are_named_before_training(store: Path, tmp_path: Path,
                                                                          start_trainer) -> None:
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    wide = save_encoder(tmp_path / "wide.pth", build_encoder(width=0.25))
    with pytest.raises(CheckpointError, match=r"method\.init_checkpoint: .*wide\.pth holds another encoder than the "
                                              r"run's: model\.width=0\.125 \(the checkpoint: 0\.25\)$"):
        pretrain(tiny_config(store, tmp_path / "a", f"method.init_checkpoint={wide}"))
    flow = save_encoder(tmp_path / "flow.pth", build_encoder(width=0.125),
                        meta={"view": "flow", "clip_settings": {"view": "flow", "length": 8}})
    with pytest.raises(ConfigError, match=r"method\.init_checkpoint: .*flow\.pth was trained on 'flow' clips, but is "
                                          r"used here for the 'rgb' view"):
        pretrain(tiny_config(store, tmp_path / "b", f"method.init_checkpoint={flow}"))
    rgb = save_encoder(tmp_path / "rgb.pth", build_encoder(width=0.125), meta={"clip_settings": {"view": "rgb"}})
    with pytest.raises(ConfigError, match=r"method\.sampler_checkpoint: .*rgb\.pth was trained on 'rgb' clips, but "
                                          r"is used here for the 'flow' view"):
        pretrain(tiny_config(store, tmp_path / "c", "method.name=coclr", f"method.sampler_checkpoint={rgb}"))
    start_trainer(tiny_config(store, tmp_path / "d", "method.name=coclr", f"method.sampler_checkpoint={flow}"))
    with pytest.raises(ConfigError, match=r"run\.amp: bf16 autocast is for CUDA devices; this run is on cpu"):
        pretrain(tiny_config(store, tmp_path / "e", "run.amp=bf16", "run.device=cpu"))
    assert not any((tmp_path / name).exists() for name in "abce")  # refused before anything was written


def test_a_sampler_trained_on_other_clips_is_said(store: Path, tmp_path: Path, start_trainer) -> None:
    """CoCLR's frozen sampler mined on clips of another shape, or on flow clipped at another bound, without a word
    (coclr eval warns of the same)."""
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    settings = {"view": "flow", "length": 16, "stride": 1, "size": 32, "flow_bound": 5.0}
    other = save_encoder(tmp_path / "other.pth", build_encoder(width=0.125),
                         meta={"view": "flow", "clip_settings": settings})
    with pytest.warns(UserWarning) as said:
        start_trainer(tiny_config(store, tmp_path / "run", "method.name=coclr", f"method.sampler_checkpoint={other}"))
    lines = [str(warning.message) for warning in said]
    assert any("was trained on clips of length 16; it mines on clips of data.length=8" in line for line in lines)
    assert any("other.pth was trained on flow clipped at +-5.0 px; this store's 'flow' has flow clipped at +-" in line
               for line in lines), lines
    same = save_encoder(tmp_path / "same.pth", build_encoder(width=0.125),
                        meta={"view": "flow", "clip_settings": {**settings, "length": 8, "flow_bound": 20.0}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        start_trainer(tiny_config(store, tmp_path / "same", "method.name=coclr", f"method.sampler_checkpoint={same}",
                                  "method.queue_size=4", "method.topk=2"))


def test_only_coclr_waits_for_a_full_queue_by_default() -> None:
    """As in the reference code: InfoNCE and UberNCE step from the first batch, CoCLR waits for a full queue."""
    def waits(*overrides: str) -> bool:
        return load_config(PretrainConfig, None, ["data.store=s", "run.out=o", *overrides]).method.waits

    assert not waits("method.name=infonce") and not waits("method.name=ubernce") and not waits("method.name=cmc")
    assert waits("method.name=coclr", "method.sampler_checkpoint=x")
    assert waits("method.name=infonce", "method.wait_for_full_queue=true")
    assert not waits("method.name=coclr", "method.simultaneous=true", "method.wait_for_full_queue=false")


def test_mining_in_both_views_uses_a_frozen_copy_of_the_trained_views_start(store: Path, tmp_path: Path,
                                                                            start_trainer) -> None:
    """``method.mine_in=both``: the queue keeps both views' embeddings of each key clip side by side; the trained
    view's is embedded by its start, which stays as it was while the learner moves, and the checkpoint holds it for
    a resumed run (the rule on those embeddings: tests/test_core_positives.py)."""
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    torch.manual_seed(1)
    sampler, start = tmp_path / "flow.pth", tmp_path / "rgb.pth"
    save_encoder(sampler, build_encoder(width=0.125))
    save_encoder(start, build_encoder(width=0.125))
    options = ["method.name=coclr", f"method.sampler_checkpoint={sampler}", f"method.init_checkpoint={start}",
               "method.mine_in=both", "optim.epochs=2"]
    trainer = start_trainer(tiny_config(store, tmp_path / "run", *options))
    model = trainer.model
    learner = model.learners["rgb"]
    assert model.own_sampler is not None and learner.queue.other.shape[1] == 2 * 128
    first = {k: v.clone() for k, v in model.own_sampler.state_dict().items()}
    assert all(torch.equal(first[k], v) for k, v in learner.encoder_q.state_dict().items())
    trainer.run()
    assert learner.queue.is_full()
    own = model.own_sampler.state_dict()
    assert all(torch.equal(first[k], own[k]) for k in first)  # frozen
    assert not torch.equal(first["head.fc2.weight"], learner.encoder_q.head.fc2.weight)  # while the learner moved
    # the other view's half, then the own view's half of the queue: the start's embeddings of unit norm
    halves = learner.queue.other[:, :128], learner.queue.other[:, 128:]
    for half in halves:
        assert torch.allclose(half.norm(dim=1), torch.ones(half.shape[0]), atol=1e-4)
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pth")
    assert state["config"]["method"]["mine_in"] == "both"
    assert all(torch.equal(state["model"][f"own_sampler.{k}"], v) for k, v in first.items())
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert any("rgb/mined_precision" in record for record in records)


@pytest.mark.parametrize("overrides, message", [
    (["method.name=coclr", "method.sampler_checkpoint=x.pth", "method.mine_in=both"], "method.init_checkpoint"),
    (["method.name=coclr", "method.simultaneous=true", "method.mine_in=both"], "alternating"),
    (["method.mine_in=all"], "method.mine_in"),
])
def test_mining_in_both_views_is_refused_where_it_cannot_apply(tmp_path: Path, overrides: list[str],
                                                               message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, tmp_path / "run", *overrides)
    with pytest.raises(ConfigError, match="method.mine_in: both needs pipeline.mode=alternate"):
        load_config(PipelineConfig, None, [f"data.store={tmp_path}", f"run.out={tmp_path}", "pipeline.mode=sim",
                                           "method.mine_in=both"])


def test_coclr_mines_with_a_sampler_of_another_embedding_size(store: Path, tmp_path: Path) -> None:
    """The queue keeps the sampler's embeddings, in the sampler's own dimension (mining compares them only with
    each other): a flow sampler of embed_dim 16 beside an RGB run of 128 failed at its first step, after the
    run folder was written."""
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    sampler = save_encoder(tmp_path / "flow16.pth", build_encoder(width=0.125, embed_dim=16),
                           meta={"view": "flow", "clip_settings": {"view": "flow", "length": 8}})
    start = save_encoder(tmp_path / "rgb.pth", build_encoder(width=0.125), meta={"clip_settings": {"view": "rgb"}})
    for mine_in, other_dim in (("other", 16), ("both", 16 + 128)):
        run = tmp_path / f"run_{mine_in}"
        init = [f"method.init_checkpoint={start}"] if mine_in == "both" else []
        trained = pretrain(tiny_config(store, run, "method.name=coclr", f"method.sampler_checkpoint={sampler}",
                                       f"method.mine_in={mine_in}", "optim.epochs=1", "run.max_steps=3", *init))
        state = load_checkpoint(trained.checkpoint)["model"]
        assert state["learners.rgb.queue.other"].shape == (8, other_dim)
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        assert [record["step"] for record in log if "rgb/mined_positives" in record] == [1, 2, 3]


def test_mined_precision_is_left_out_where_no_mined_positive_has_a_known_class(tmp_path: Path) -> None:
    """The queue's first step holds nothing mined: the precision of its mined positives is undefined, not 0 (which
    lowered the stage's mean precision in the report), and so it is for videos without labels."""
    from coclr.eval.report import mined_precision
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    store = make_random_store(tmp_path / "store")
    sampler = save_encoder(tmp_path / "flow.pth", build_encoder(width=0.125),
                           meta={"view": "flow", "clip_settings": {"view": "flow", "length": 8}})
    run = tmp_path / "run"
    pretrain(tiny_config(store, run, "method.name=coclr", f"method.sampler_checkpoint={sampler}",
                         "optim.epochs=1", "run.max_steps=4"))
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    steps = [record for record in log if "rgb/mined_positives" in record]
    assert steps[0]["rgb/mined_positives"] == 0 and "rgb/mined_precision" not in steps[0]  # an empty queue
    scored = [record["rgb/mined_precision"] for record in steps if "rgb/mined_precision" in record]
    assert scored and all(0 <= value <= 1 for value in scored)
    assert mined_precision(run / "log.jsonl", "rgb") == pytest.approx(100 * sum(scored) / len(scored))
    # An older log's NaN (or a 0 logged at an empty step) is not averaged in as a value
    with (run / "log.jsonl").open("a") as out:
        out.write(json.dumps({"step": 99, "rgb/mined_precision": float("nan")}) + "\n")
    assert mined_precision(run / "log.jsonl", "rgb") == pytest.approx(100 * sum(scored) / len(scored))
