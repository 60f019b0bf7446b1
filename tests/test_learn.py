"""``coclr learn``: the budget's choice, the label-free measures, and a whole run on generated videos (killed in
training and continued), its outputs, its report in a real browser, and its refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from coclr.errors import ConfigError
from coclr.eval.label_free import alignment, neighbour_agreement, quality, uniformity
from coclr.learn.budget import (
    MARGIN,
    MIN_STEPS,
    MODELS,
    TARGET_STEPS,
    TRAINING,
    Costs,
    Footage,
    Model,
    Plan,
    choose_plan,
    parse_budget,
)

# ------------------------------------------------------------------------------------------------ the budget


def footage(videos: int = 768, frames: int = 12, short_side: int = 32) -> Footage:
    return Footage(videos, videos * frames, short_side, 1.0, frames, [frames] * videos)


def costs(step_ms: dict[Model, float]) -> Costs:
    return Costs(decode_frame=1e-4, store_frame={m.size: 1e-4 for m in MODELS},
                 flow_pair={m.size: 1e-3 for m in MODELS}, step={m.key: ms / 1e3 for m, ms in step_ms.items()},
                 lone_step={m.key: ms / 1e3 for m, ms in step_ms.items()},
                 forward={m.key: ms / 1e3 / 100 for m, ms in step_ms.items()},
                 epoch={m.key: 0.05 for m in step_ms}, stage={m.key: 1.0 for m in step_ms}, workers=2,
                 start={m.key: 3.0 for m in step_ms})


SMALL, WIDER = MODELS[0], MODELS[1]


def test_the_largest_model_that_affords_the_target_steps_fills_the_budget():
    measured = costs({SMALL: 100, WIDER: 150})
    plan = choose_plan(footage(), measured, budget=900)
    assert plan.model == WIDER  # 150 ms a step affords the target within 15 min; both suit 32-px videos
    assert plan.steps >= TARGET_STEPS and sum(plan.estimates.values()) <= MARGIN * 900
    training = plan.estimates["infonce"] + plan.estimates["coclr"]
    assert training > 0.8 * (MARGIN * 900 - sum(v for k, v in plan.estimates.items() if k not in TRAINING))
    assert plan.epochs["infonce"] == 2 * plan.epochs["coclr"] or plan.epochs["coclr"] == 100  # the study's split
    assert plan.batch == 32 and plan.queue == 256 and plan.topk == 5  # 768 videos: the quick study's recipe scaled
    slow = choose_plan(footage(), costs({SMALL: 100, WIDER: 600}), budget=900)
    assert slow.model == SMALL and any("fewer steps than the target" in r for r in slow.reasons)


def test_a_crop_above_the_videos_short_side_is_not_a_candidate():
    measured = costs({m: 10 for m in MODELS})
    assert choose_plan(footage(short_side=32), measured, 900).model.size == 32
    assert choose_plan(footage(short_side=240, frames=300), measured, 10 * 3600).model == MODELS[-1]
    assert choose_plan(footage(short_side=240, frames=12), measured, 10 * 3600).model.length == 8  # short videos


def test_too_few_videos_or_too_small_a_budget_is_refused_saying_what_would_do():
    with pytest.raises(ConfigError, match="7 readable video.*at least 8"):
        choose_plan(footage(videos=7), costs({SMALL: 100}), 900)
    with pytest.raises(ConfigError, match=r"--budget 60 s is too small .* give --budget (\d+)m or more") as error:
        choose_plan(footage(), costs({SMALL: 100}), 60)
    needed = int(str(error.value).split("--budget ")[-1].split("m")[0]) * 60
    plan = choose_plan(footage(), costs({SMALL: 100}), needed)  # what it says would do, does
    assert plan.steps >= MIN_STEPS * 0.9


def test_window_counts_are_those_of_the_sliding_windows():
    from coclr.data.sampling import sliding_windows
    from coclr.learn.budget import windows_of

    counts = [1, 5, 8, 9, 10, 11, 12, 13, 40, 41, 300]
    for model in (MODELS[0], MODELS[3]):
        assert windows_of(Footage(len(counts), sum(counts), 32, 1.0, 1, counts), model) == \
            sum(len(sliding_windows(n, model.length, 1)) for n in counts)


def test_budget_durations():
    assert parse_budget("90s") == 90 and parse_budget("15m") == 900 and parse_budget("1.5h") == 5400
    assert parse_budget("20") == 1200
    for bad in ("fast", "-5m", "0", "nanm"):
        with pytest.raises(ConfigError, match="--budget"):
            parse_budget(bad)


def test_a_plan_round_trips_through_json():
    plan = choose_plan(footage(), costs({SMALL: 100}), 900)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


# ------------------------------------------------------------------------------------ label-free measures


def test_alignment_and_uniformity_match_their_definitions():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(20, 6)), rng.normal(size=(20, 6))
    units = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in (a, b)]
    expected = np.mean([np.sum((p - q) ** 2) for p, q in zip(*units)])
    assert alignment(a, b) == pytest.approx(expected)
    potentials = [np.exp(-2 * np.sum((units[0][i] - units[0][j]) ** 2)) for i in range(20) for j in range(i + 1, 20)]
    assert uniformity(a) == pytest.approx(np.log(np.mean(potentials)))
    assert uniformity(np.ones((5, 6))) == pytest.approx(0.0)  # every video on one point
    assert alignment(a, a) == pytest.approx(0.0)


def test_neighbour_agreement_and_collapse():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 8))
    assert neighbour_agreement(x, x * 3 + 0.5) == 1.0  # the same geometry
    assert neighbour_agreement(x, rng.normal(size=(30, 8))) < 0.3
    assert quality(np.ones((10, 8)))["collapsed"] and not quality(x)["collapsed"]
    windows = np.repeat(x, 2, axis=0) + rng.normal(scale=0.01, size=(60, 8))
    measured = quality(x, windows, np.repeat(np.arange(30), 2))
    assert measured["alignment"] < 0.01 and measured["effective_rank"] > 5


def test_progress_bars_report_to_an_observer_and_stay_silent(capsys):
    from coclr.progress import bar, observed

    seen = []
    with observed(lambda desc, n, total: seen.append((desc, n, total))):
        with bar(total=3, desc="work") as progress:
            progress.update(2)
        list(bar(range(2), desc="loop"))
    assert seen == [("work", 2, 3), ("loop", 1, 2), ("loop", 1, 2)]  # tqdm takes the total from the iterable
    assert "work" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ a whole run

TINY_PLAN = {"model": {"width": 0.125, "size": 32, "length": 8}, "batch": 4, "queue": 8, "topk": 2,
             "epochs": {"infonce": 2, "coclr": 1}, "steps": 32, "budget": 300.0, "reasons": ["a test's plan"],
             "estimates": {"store": 1.0, "flow": 1.0, "infonce": 10.0, "coclr": 10.0, "embed": 4.0, "quality": 2.0,
                           "fixed": 2.0}}
RUN = """
import json, sys
import coclr.cli  # the process policy of every entry point
from coclr.learn import LearnOptions, learn
from coclr.learn.budget import Plan
plan = Plan.from_dict(json.loads(sys.argv[3]))
summary = learn([sys.argv[1]], sys.argv[2], LearnOptions(budget=300, plan=plan, workers=0, progress=False,
                labels=sys.argv[4] if len(sys.argv) > 4 else None))
print(summary)
sys.exit(3 if summary.failed else 0)
"""


def run_learn(videos: Path, out: Path, *labels: str, wait: bool = True) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-c", RUN, str(videos), str(out), json.dumps(TINY_PLAN), *labels],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if wait:
        process.wait(timeout=600)
    return process


def files_digest(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


PARENT = """
import subprocess, sys, time
from coclr.study.scheduler import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_command_started_by_a_job_dies_with_it_even_by_sigkill():
    """The children of ``run_jobs`` (a study's commands, learn's side-by-side stages) get SIGKILL when their parent
    dies, ``kill -9`` included: none goes on training and holding its folder behind a job that is gone."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert Path(f"/proc/{child}").exists()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists() and "Z" not in \
            Path(f"/proc/{child}/stat").read_text().split()[2]:
        time.sleep(0.05)
    state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}").exists() else "gone"
    assert state in ("gone", "Z"), state


def children_of(out: Path) -> list[str]:
    """Command lines of live processes that write under ``out`` (its configs)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(out / "configs") in command:
            found.append(command)
    return found


@pytest.fixture(scope="module")
def learnt(tmp_path_factory):
    """A run on 16 generated videos and a damaged one, killed with SIGKILL in its second training stage and then
    continued by the same command; returns (videos folder, labels file, out folder, the finishing run's output)."""
    from coclr.synth import SynthConfig, write_videos

    root = tmp_path_factory.mktemp("learn")
    config = SynthConfig(num_classes=4, train_scenes=2, test_scenes=2, actions_per_scene=2, frames=10)
    labels = write_videos(root / "data", config)
    videos = root / "data" / "videos"
    (videos / "broken.mp4").write_bytes(b"not a video at all" * 100)
    out = root / "out"
    process = run_learn(videos, out, wait=False)
    deadline = time.monotonic() + 300
    while not (out / "pipeline" / "infonce_flow" / "log.jsonl").is_file():
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert json.loads((out / "learn.json").read_text())["status"] == "running"
    deadline = time.monotonic() + 10  # its side-by-side training commands are gone: no orphan holds a folder
    while time.monotonic() < deadline and children_of(out):
        time.sleep(0.2)
    assert not children_of(out)
    finished = run_learn(videos, out, str(labels))
    output = finished.stdout.read()
    assert finished.returncode == 3, output  # the damaged video is listed, the others learnt from
    return videos, labels, out, output


@pytest.mark.slow
def test_a_killed_run_continues_to_encoders_embeddings_and_scores(learnt):
    from coclr.embed.output import Embeddings
    from coclr.models.loading import load_encoder, read_clip_settings

    videos, labels, out, output = learnt
    record = json.loads((out / "learn.json").read_text())
    assert record["status"] == "done" and record["videos"] == 17
    assert [item["path"] for item in record["failed"]] == [str(videos / "broken.mp4")]
    assert "1 video(s) could not be read" in output and "broken.mp4" in output
    manifest = json.loads((out / "pipeline" / "manifest.json").read_text())
    assert [s["status"] for s in manifest["stages"]] == ["done"] * 6
    first = [json.loads(line) for line in (out / "pipeline" / "infonce_rgb" / "log.jsonl").read_text().splitlines()]
    assert len([r for r in first if "epoch_loss" in r]) == 2  # the stage finished before the kill was not redone
    for view in ("rgb", "flow"):
        backbone, head = load_encoder(out / f"encoder_{view}.pth")
        assert head is not None and read_clip_settings(out / f"encoder_{view}.pth")["view"] == view
    names = sorted(p.name for p in videos.glob("*.mp4") if p.name != "broken.mp4")
    for name, dim in (("rgb", 128), ("flow", 128), ("two_stream", 256)):
        embeddings = Embeddings(out / "embeddings" / name)
        assert embeddings.videos.shape == (16, dim)
        assert sorted(Path(r["path"]).name for r in embeddings.video_records) == names
        np.testing.assert_allclose(np.linalg.norm(embeddings.videos, axis=1), 1.0, atol=1e-5)
    stages = record["stages"]
    assert list(stages) == ["infonce_rgb", "infonce_flow", "cycle1_rgb", "cycle1_flow", "cycle2_rgb", "cycle2_flow"]
    assert all({"effective_rank", "alignment", "uniformity", "collapsed"} <= set(entry) for entry in stages.values())
    assert set(record["agreement"]) == {"infonce", "cycle1", "cycle2"}
    scores = record["labels"]["embeddings"]
    assert set(scores) == {"rgb", "flow", "two_stream"} and scores["rgb"]["queries"] == 8
    assert all(0 <= scores[name]["R@1"] <= scores[name]["R@5"] <= 100 for name in scores)


@pytest.mark.slow
def test_the_embeddings_are_search_folders_and_the_encoders_embed(learnt, tmp_path, capsys):
    from coclr.cli import main

    videos, _, out, _ = learnt
    query = sorted(videos.glob("*.mp4"))[0]
    assert main(["search", str(out / "embeddings" / "two_stream"), "--query", str(query), "-k", "3"]) == 0
    hits = capsys.readouterr().out
    assert query.name in hits.splitlines()[1] or query.name in hits  # a video's nearest is itself
    assert main(["embed", str(query), "--checkpoint", str(out / "encoder_flow.pth"), "--out", str(tmp_path / "e"),
                 "--quiet"]) == 0
    from coclr.embed.output import Embeddings

    mine = Embeddings(out / "embeddings" / "flow")
    again = Embeddings(tmp_path / "e")
    np.testing.assert_allclose(again.videos[0], mine.videos[mine.row_of(query)], atol=1e-5)


@pytest.mark.slow
def test_the_same_command_on_a_finished_run_changes_nothing_and_other_options_are_refused(learnt):
    videos, labels, out, _ = learnt
    before = files_digest(out)
    started = time.monotonic()
    again = run_learn(videos, out, str(labels))
    assert again.returncode == 3 and "finished before; nothing to do" in again.stdout.read()
    assert time.monotonic() - started < 60 and files_digest(out) == before
    from coclr.learn import LearnOptions, learn

    with pytest.raises(ConfigError, match="budget=300.0 \\(given 600.0\\)"):
        learn([videos], out, LearnOptions(budget=600))
    fewer = sorted(videos.glob("*.mp4"))[:-3]
    with pytest.raises(ConfigError, match="learnt from other videos: 3 removed"):
        learn(fewer, out, LearnOptions(budget=300))
    assert files_digest(out) == before


@pytest.mark.slow
def test_the_report_shows_every_stage_and_names_every_video_in_a_browser(learnt, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    from coclr.eval.gallery import QUERY_COLOUR
    from test_report import CHROMIUM_FLAGS, _colour_pixels

    videos, _, out, _ = learnt
    page = (out / "report.html").as_uri()
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'p1'}", "--dump-dom", page],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    text = " ".join(dom.split())
    for heading in ("The run", "Training", "Each stage, without labels", "The embeddings", "Nearest neighbours",
                    "The videos"):
        assert f">{heading}" in text
    for stage in ("infonce_rgb", "cycle2_flow"):
        assert stage in text
    for path in videos.glob("*.mp4"):
        assert path.name in text
    assert "broken.mp4: left out" in text
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'p2'}", f"--screenshot={shot}",
                    "--window-size=1200,3000", page], check=True, capture_output=True, timeout=60)
    blue = tuple(int(QUERY_COLOUR[i: i + 2], 16) for i in (1, 3, 5))
    assert _colour_pixels(shot, blue, 12) > 8 * 300  # the sampled videos' borders: their thumbnails are drawn


@pytest.mark.slow
def test_two_torchrun_processes_learn_one_folder(learnt, tmp_path):
    """``torchrun --nproc_per_node=2`` (gloo): rank 0 holds the folder and makes the plan, both share the store, the
    flow, every batch (half each: the plan's global batch) and the embedding; one folder results, as one process
    writes it."""
    from coclr.embed.output import Embeddings
    from coclr.train.checkpoint import load_checkpoint
    from test_train_distributed import free_port

    videos, _, _, _ = learnt
    script = tmp_path / "run.py"
    script.write_text(RUN)
    out = tmp_path / "two"
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"} | {"OMP_NUM_THREADS": "1"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          f"--master_port={free_port()}", str(script), str(videos), str(out), json.dumps(TINY_PLAN)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode != 0 and "broken.mp4" in two.stdout, two.stdout + two.stderr  # rank 0's exit 3
    record = json.loads((out / "learn.json").read_text())
    assert record["status"] == "done" and len(record["failed"]) == 1
    checkpoint = load_checkpoint(out / "pipeline" / "cycle2_flow" / "checkpoint_last.pth")
    assert checkpoint["world_size"] == 2 and checkpoint["config"]["run"]["batch_size"] == TINY_PLAN["batch"] // 2
    assert len(Embeddings(out / "embeddings" / "two_stream").videos) == 16
    assert not list((out / "embeddings" / "two_stream" / "chunks").glob("*"))


@pytest.mark.slow
def test_learn_refuses_a_folder_holding_files_it_did_not_write(learnt, tmp_path):
    from coclr.learn import LearnOptions, learn
    from coclr.runfolder import FolderRefused

    videos, _, out, _ = learnt
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own notes")
    with pytest.raises(FolderRefused, match="notes.txt"):
        learn([videos], mine, LearnOptions(budget=300, plan=Plan.from_dict(TINY_PLAN)))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    with pytest.raises(FolderRefused, match="inside"):  # nor inside another command's folder
        learn([videos], out / "embeddings" / "rgb" / "again", LearnOptions(budget=300, plan=Plan.from_dict(TINY_PLAN)))


@pytest.mark.slow
def test_a_refused_budget_leaves_no_folder_behind(learnt, tmp_path, monkeypatch):
    """The plan is made before the folder is claimed: a budget too small is one line, and nothing is written, so
    the same folder takes the next command with a larger budget."""
    from coclr.learn import LearnOptions, learn, run

    def too_small(*args, **kwargs):
        raise ConfigError("--budget 1 min is too small for 16 videos on this machine: give --budget 3m or more")

    monkeypatch.setattr(run, "make_plan", too_small)
    videos, _, _, _ = learnt
    with pytest.raises(ConfigError, match="too small"):
        learn([videos], tmp_path / "new", LearnOptions(budget=60))
    assert not (tmp_path / "new").exists()


def test_infonce_stages_side_by_side_halve_their_time_in_the_plan():
    """On the CPU of one process the two InfoNCE stages train at once, one core each: the plan counts their steps
    at the one-thread step time, once for both."""
    measured = costs({SMALL: 100})
    apart = choose_plan(footage(), measured, 900)
    measured.side_by_side = True
    together = choose_plan(footage(), measured, 900)
    assert together.steps > apart.steps
    assert together.estimates["infonce"] == pytest.approx(apart.estimates["infonce"] / 2 * together.steps
                                                          / apart.steps, rel=0.05)


@pytest.mark.slow
def test_the_command_line_of_a_finished_run(learnt, capsys):
    """``coclr learn`` through the CLI: a finished run returns at once, names its outputs and the video it left out
    (exit 3); a bad budget is one line (exit 2)."""
    from coclr.cli import main

    videos, labels, out, _ = learnt
    assert main(["learn", str(videos), "--out", str(out), "--budget", "300s", "--labels", str(labels)]) == 3
    printed = capsys.readouterr().out
    assert "finished before; nothing to do" in printed and "broken.mp4" in printed
    assert str(out / "embeddings" / "two_stream") in printed
    assert main(["learn", str(videos), "--out", str(out), "--budget", "soon"]) == 2
    assert "--budget: 'soon' is not a duration" in capsys.readouterr().err
