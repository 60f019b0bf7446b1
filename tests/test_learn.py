"""``coclr learn``: the budget's choice, the label-free measures, and a whole run on generated videos (killed in
training and continued), its outputs, its report in a real browser, and its refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from coclr.curate.alter import ALTERATIONS
from coclr.errors import ConfigError, DataError
from coclr.eval.label_free import alignment, neighbour_agreement, quality, uniformity
from coclr.learn.budget import (
    CURATE_SHARE,
    CURATE_VIDEOS,
    MARGIN,
    MAX_EPOCHS,
    MIN_STEPS,
    MODELS,
    PACE_BAND,
    PACE_LIMITS,
    SIZED_SHARE,
    STAGE_SHARES,
    TARGET_STEPS,
    TRAINING,
    Costs,
    Footage,
    Model,
    Plan,
    calibration_seconds,
    choose_plan,
    curate_seconds,
    curate_videos,
    pace,
    size_stage,
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
    with pytest.raises(ConfigError, match=r"--budget 1m is too small .* give --budget (\d+)m or more") as error:
        choose_plan(footage(), costs({SMALL: 100}), 60)
    with pytest.raises(ConfigError, match=r"--budget 100s is too small") as small:  # (it said "2 min", then
        choose_plan(footage(), costs({SMALL: 100}), 100)  # "give 2m")
    # the parts it names account for the budget (they summed to less than it: the measurement and margin unsaid)
    assert "this measurement took " in str(small.value) and "all within 95% of the budget" in str(small.value)
    needed = int(str(error.value).split("--budget ")[-1].split("m")[0]) * 60
    plan = choose_plan(footage(), costs({SMALL: 100}), needed)  # what it says would do, does
    assert plan.steps >= MIN_STEPS * 0.9
    assert choose_plan(footage(), costs({SMALL: 120}), needed).steps >= MIN_STEPS * 0.9  # on a machine 20% slower
    # at the next run too (the suggestion had no headroom: 3m, then "give 4m")


def test_window_counts_are_those_of_the_sliding_windows():
    from coclr.data.sampling import sliding_windows
    from coclr.learn.budget import windows_of

    counts = [1, 5, 8, 9, 10, 11, 12, 13, 40, 41, 300]
    for model in (MODELS[0], MODELS[3]):
        assert windows_of(Footage(len(counts), sum(counts), 32, 1.0, 1, counts), model) == \
            sum(len(sliding_windows(n, model.length, 1)) for n in counts)


def test_budget_durations():
    from coclr.learn.options import parse_budget

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


def _nearest_by_loop(queries: np.ndarray, gallery: np.ndarray, k: int, skip_self: bool) -> list[list[int]]:
    """The k most similar gallery rows of each query by cosine after centring by the gallery's mean, ties to the
    lower index, one pair at a time (the slow, obvious reference)."""
    mean = gallery.mean(axis=0)
    unit = [(v - mean) / np.linalg.norm(v - mean) for v in gallery]
    found = []
    for i, query in enumerate(queries):
        q = (query - mean) / np.linalg.norm(query - mean)
        scored = [(-float(q @ g), j) for j, g in enumerate(unit) if not (skip_self and j == i)]
        found.append([j for _, j in sorted(scored)[:k]])
    return found


def test_the_new_label_free_measures_match_their_definitions():
    from coclr.eval.label_free import neighbour_overlap, neighbour_stability, rankme, temporal_retrieval

    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(25, 6)), rng.normal(size=(25, 6))
    near_a, near_b = _nearest_by_loop(a, a, 5, True), _nearest_by_loop(b, b, 5, True)
    expected = np.mean([len(set(x) & set(y)) / 5 for x, y in zip(near_a, near_b)])
    assert neighbour_overlap(a, b) == pytest.approx(expected)
    assert neighbour_overlap(a, 2 * a + 1) == 1.0 and neighbour_stability(a, a) == 1.0
    assert neighbour_overlap(a[:4], b[:4], k=5) is not None  # fewer videos: k shrinks to videos - 2
    second = a + rng.normal(scale=0.5, size=a.shape)
    own = [row[0] == i for i, row in enumerate(_nearest_by_loop(a, second, 1, False))]
    assert temporal_retrieval(a, second) == pytest.approx(np.mean(own)) and 0.3 < np.mean(own) < 1
    assert temporal_retrieval(np.ones((6, 4)), np.ones((6, 4))) == pytest.approx(1 / 6)  # ties: the first video
    singular = np.linalg.svd(a - a.mean(axis=0), compute_uv=False)
    share = singular / singular.sum() + 1e-7
    assert rankme(a - a.mean(axis=0)) == pytest.approx(np.exp(-(share * np.log(share)).sum()))
    assert rankme(np.zeros((5, 3))) == 0.0
    line = np.outer(rng.normal(size=25), rng.normal(size=6))
    assert rankme(line - line.mean(axis=0)) == pytest.approx(1.0, abs=1e-4)
    windows = np.repeat(a, 2, axis=0) + rng.normal(scale=0.01, size=(50, 6))
    measured = quality(a, windows, np.repeat(np.arange(25), 2))
    assert measured["temporal_retrieval"] == 1.0 and measured["neighbour_stability"] > 0.9


def test_progress_bars_report_to_an_observer_and_stay_silent(capsys):
    from coclr.progress import bar, observed

    seen = []
    with observed(lambda desc, n, total: seen.append((desc, n, total))):
        with bar(total=3, desc="work") as progress:
            progress.update(2)
        list(bar(range(2), desc="loop"))
    assert seen == [("work", 2, 3), ("loop", 1, 2), ("loop", 1, 2)]  # tqdm takes the total from the iterable
    assert "work" not in capsys.readouterr().err
    seen.clear()
    with observed(lambda desc, n, total: seen.append(n)), bar(total=64, desc="InfoNCE") as progress:
        for done in (3, 5, 5, 11, 64):  # a scheduler's bar: it reports the epochs done, by their difference
            progress.update(done - progress.n)
    assert seen == [3, 2, 0, 6, 53] and progress.n == 64  # the observer gets each difference, not the total


def encoder_file(path: Path, view: str, width: float = 0.125, length: int = 8, size: int = 32,
                 flow_bound: float | None = None) -> Path:
    """A small encoder of ours that records the clips it was trained on."""
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    settings = {"view": view, "length": length, "size": size, "flow_bound": flow_bound}
    return save_encoder(path, build_encoder(width=width), meta={"clip_settings": settings})


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


def run_learn(videos: Path, out: Path, *labels: str, wait: bool = True, plan: dict | None = None
              ) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-c", RUN, str(videos), str(out), json.dumps(plan or TINY_PLAN),
                                *labels],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if wait:
        process.wait(timeout=600)
    return process


def files_digest(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


PARENT = """
import subprocess, sys, time
from coclr.interrupts import die_with_parent
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
    """Command lines of live processes that run a job of ``out`` (their task records are in its logs)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(out / "logs") in command:
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
    assert record["phases_done"] == ["store", "flow", "infonce", "coclr", "quality", "embed", "curate"]
    assert [item["path"] for item in record["failed"]] == [str(videos / "broken.mp4")]
    assert "1 video(s) left out of what failed for them" in output and "broken.mp4" in output
    manifest = json.loads((out / "pipeline" / "manifest.json").read_text())
    assert [s["status"] for s in manifest["stages"]] == ["done"] * 6
    first = [json.loads(line) for line in (out / "pipeline" / "infonce_rgb" / "log.jsonl").read_text().splitlines()]
    assert len([r for r in first if "epoch_loss" in r]) == 2  # the stage finished before the kill was not redone
    for view in ("rgb", "flow"):
        backbone, head = load_encoder(out / f"encoder_{view}.pth")
        assert head is not None and read_clip_settings(out / f"encoder_{view}.pth")["view"] == view
        tensors, tensors_head = load_encoder(out / f"encoder_{view}.safetensors")  # the same, as safetensors
        assert all(torch.equal(value, tensors.state_dict()[key]) for key, value in backbone.state_dict().items())
        assert all(torch.equal(value, tensors_head.state_dict()[key]) for key, value in head.state_dict().items())
        settings = read_clip_settings(out / f"encoder_{view}.pth")
        assert read_clip_settings(out / f"encoder_{view}.safetensors") == settings
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

    with pytest.raises(ConfigError, match="budget='5m' \\(given '10m'\\)"):  # (as --budget takes it)
        learn([videos], out, LearnOptions(budget=600))
    fewer = sorted(videos.glob("*.mp4"))[:-3]
    with pytest.raises(ConfigError, match="learnt from other videos: 3 removed"):
        learn(fewer, out, LearnOptions(budget=300))
    assert files_digest(out) == before
    original = labels.read_bytes()
    finished = json.loads((out / "learn.json").read_text())
    scored = finished["labels"]["videos"]
    labels.write_bytes(b"".join(original.splitlines(keepends=True)[:-2]))  # the same file, two labels fewer
    try:
        edited = run_learn(videos, out, str(labels))
        said = edited.stdout.read()
        assert edited.returncode == 3 and "its measures taken again with the labels given" in said
        assert "\nplan: " not in said and not said.startswith("plan: ")  # (the plan again, then a bar's time left)
        record = json.loads((out / "learn.json").read_text())
        assert record["labels"]["videos"] == scored - 2
        # scoring is not learning: the run's time stands (it grew by each scoring, "5 min of a 3 min budget")
        assert (record["seconds"], record["phases"]) == (finished["seconds"], finished["phases"])
        unlabelled = run_learn(videos, out)  # no --labels now: no scores of the file given before
        assert unlabelled.returncode == 3 and "its label scores dropped" in unlabelled.stdout.read()
        record = json.loads((out / "learn.json").read_text())
        assert "labels" not in record and record["labels_file"] is None
        assert record["seconds"] == finished["seconds"]
        assert "labels.csv" not in (out / "report.html").read_text()
    finally:
        labels.write_bytes(original)
        assert run_learn(videos, out, str(labels)).returncode == 3  # as the fixture left it, for the tests after
    assert json.loads((out / "learn.json").read_text())["labels"]["videos"] == scored


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
    assert "broken.mp4</bdi>: left out (" in text
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
    assert record["curate"]["rule"].startswith("the distribution rule")  # one process curates, without the group
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


def _run_sized(plan: Plan, early: float, coclr: float) -> tuple[float, list[int]]:
    """A run of ``plan`` whose phases before the CoCLR stages (and after them) take ``early`` times their estimate
    and whose CoCLR epochs take ``coclr`` times theirs, each CoCLR stage sized as it starts: the share of the budget
    it takes, and the epochs of each stage."""
    took = {name: plan.estimates[name] * early for name in ("store", "flow", "infonce")}
    spent = plan.estimates["measure"] + sum(took.values())
    per_epoch = coclr * plan.estimates["coclr"] / (4 * plan.epochs["coclr"])
    chosen = []
    for left in (4, 3, 2, 1):
        epochs, why = size_stage(plan, spent, took, left, per_epoch if chosen else None)
        assert why["epochs"] == epochs and why["measured"] == bool(chosen) and why["stages_left"] == left
        chosen.append(epochs)
        spent += epochs * per_epoch
    spent += early * sum(plan.estimates.get(name, 0.0) for name in ("quality", "embed", "curate", "fixed"))
    return spent / plan.budget, chosen


def test_coclr_stages_sized_as_they_start_end_the_run_near_its_target_whatever_the_estimates_missed():
    """A machine whose CoCLR epochs take 0.6 to 1.6 times the plan's estimate, and whose other phases 0.8 to 1.25
    times theirs, ends within 85-100% of the budget when each CoCLR stage is sized by the time left (the plan's own
    epochs miss that range on the same machines); the later stages absorb what the first one misjudged."""
    plan = choose_plan(footage(), costs({SMALL: 100, WIDER: 150}), budget=900)
    assert plan.fit_budget and not plan.stage_epochs
    for coclr in (0.6, 1.0, 1.6):
        for early in (0.8, 1.0, 1.25):
            share, epochs = _run_sized(plan, early, coclr)
            assert 0.85 <= share <= 1.0, (coclr, early, share, epochs)
            if early == 1.0 and coclr == 1.0:
                assert abs(share - SIZED_SHARE) < 0.02 and max(epochs) - min(epochs) <= 1
    assert _run_sized(plan, 1.0, 1.6)[1][1] < _run_sized(plan, 1.0, 1.6)[1][0]  # slower than thought: fewer epochs
    planned = sum(plan.estimates.values()) - plan.estimates["coclr"]
    for coclr in (0.6, 1.6):  # the planned epochs on the same machines
        assert not 0.85 <= (planned + coclr * plan.estimates["coclr"]) / plan.budget <= 1.0


def test_a_stage_is_sized_to_one_epoch_at_least_and_the_cap_at_most_and_the_pace_is_bounded():
    plan = choose_plan(footage(), costs({SMALL: 100, WIDER: 150}), budget=900)
    assert size_stage(plan, 2000.0, {}, 2, None)[0] == 1  # the budget is spent: one epoch
    assert size_stage(plan, 0.0, {}, 1, 1e-3)[0] == MAX_EPOCHS["coclr"]
    assert pace({"store": 10.0, "flow": 10.0}, {}) == 1.0
    assert pace({"store": 10.0, "flow": 10.0}, {"store": 12.0, "flow": 18.0, "other": 100.0}) == pytest.approx(
        1.5 / PACE_BAND)  # the part past the estimates' own error
    assert pace({"store": 10.0}, {"store": 1000.0}) == pytest.approx(PACE_LIMITS[1] / PACE_BAND)
    assert pace({"store": 10.0}, {"store": 0.1}) == pytest.approx(PACE_LIMITS[0] * PACE_BAND)
    for ratio in (0.88, 0.95, 1.0, 1.1, 1.14):  # within the estimates' own error: the plan's pace
        assert pace({"infonce": 100.0}, {"infonce": 100.0 * ratio}) == 1.0
    assert pace({"infonce": 100.0}, {"infonce": 0.8 * 100.0}) == pytest.approx(0.8 * PACE_BAND)
    slow, fast = (size_stage(plan, 300.0, {"infonce": plan.estimates["infonce"] * f}, 4, None) for f in (2.0, 0.5))
    assert slow[1]["later_phases"] > fast[1]["later_phases"] and slow[0] <= fast[0]
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).fit_budget  # recorded, and read back


def test_the_curations_calibration_takes_at_most_its_share_of_the_budget():
    """Calibrating the duplicate threshold on four videos' altered copies of 300 frames would take a large part of
    a short budget: the plan calibrates on as many as its share affords (none: the distribution rule), counts only
    those, and says so; a long budget keeps all four."""
    long_videos = footage(videos=8, frames=300, short_side=240)
    measured = costs({SMALL: 100})
    one = calibration_seconds(long_videos, SMALL, measured, 1)
    assert calibration_seconds(long_videos, SMALL, measured, 3) == pytest.approx(3 * one)
    encoding = dataclasses.replace(measured, encode_frame=0.01)  # writing the copies counts too
    assert calibration_seconds(long_videos, SMALL, encoding, 1) - one == pytest.approx(len(ALTERATIONS) * 300 * 0.01)
    assert curate_videos(long_videos, SMALL, measured, None) == CURATE_VIDEOS
    assert curate_videos(long_videos, SMALL, measured, 4 * one / CURATE_SHARE) == 4
    assert curate_videos(long_videos, SMALL, measured, 2.5 * one / CURATE_SHARE) == 2
    assert curate_videos(long_videos, SMALL, measured, 0.5 * one / CURATE_SHARE) == 0
    for budget, expected in ((2.5 * one / CURATE_SHARE, 2), (20 * one / CURATE_SHARE, 4)):
        plan = choose_plan(long_videos, measured, budget=budget)
        assert plan.curate_videos == expected and plan.estimates["curate"] == pytest.approx(
            curate_seconds(long_videos, SMALL, measured, expected))
        said = [reason for reason in plan.reasons if "curation" in reason]
        assert said == ([] if expected == CURATE_VIDEOS else
                        [f"the curation calibrates its duplicate threshold on 2 video(s)' altered copies, the most "
                         f"within {CURATE_SHARE:.0%} of the budget"])


def test_encoding_the_curations_copies_a_thumbnail_and_a_fingerprint_are_timed_on_the_videos(tmp_path):
    import threading

    from coclr.learn.budget import _time_encoding, _time_fingerprint, _time_per_video, _time_thumbnail
    from coclr.video.decode import write_mp4

    frames = [np.random.default_rng(0).integers(0, 255, (45, 33, 3), dtype=np.uint8) for _ in range(8)]
    seconds = _time_encoding([[], frames])  # odd sides cropped to even ones, as the copies are
    assert 0 < seconds < 1.0
    video = write_mp4(tmp_path / "v.mp4", np.stack(frames)[:, :44, :32], fps=10)
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    assert 0 < _time_thumbnail([str(tmp_path / "broken.mp4"), str(video), str(video)])[1] < 5.0
    assert _time_thumbnail([str(tmp_path / "broken.mp4")]) == (0.0, 0.0)
    assert 0 < _time_fingerprint([str(tmp_path / "broken.mp4"), str(video), str(video)])[1] < 5.0
    assert _time_fingerprint([str(tmp_path / "broken.mp4")]) == (0.0, 0.0)
    threads = []  # with workers, a pool of that many threads, each run once first, does every video once per thread

    def work(path: str) -> None:
        threads.append(threading.get_ident())
        time.sleep(0.2 if len(threads) <= 4 else 0.01)  # each thread's first run (and the loading one) slower

    start, seconds = _time_per_video([str(tmp_path / "broken.mp4"), str(video)], work, 3)
    assert len(threads) == 1 + 3 + 6 and len(set(threads[1:4])) == 3 and set(threads[4:]) <= set(threads[1:4])
    assert 0.002 < seconds < 0.02 and start > 0.15  # 10 ms on each of 3 threads; the first runs' excess: the start


def test_the_store_is_counted_from_its_job_timed_as_it_runs():
    """The store's estimate: the job's start, then each worker's share of the videos' own parts and further frames
    (with fewer videos than workers, each worker has one); plans made before, one process's figures over the
    workers. The figures come from the timed videos' notes: the workers' first video after the start, their time
    less the further frames per video, the cost per frame weighted by each video's length."""
    from coclr.learn.budget import estimates, store_figures, store_seconds

    timed = dataclasses.replace(costs({SMALL: 100}), store_job={32: 0.02}, store_video={32: 0.004},
                                store_next={32: 1e-4})
    many = footage(videos=768, frames=12)
    assert store_seconds(many, 32, timed) == pytest.approx(0.02 + (768 * 0.004 + 768 * 11 * 1e-4) / 2)
    assert store_seconds(footage(videos=1, frames=12), 32, timed) == pytest.approx(0.02 + 0.004 + 11 * 1e-4)
    assert store_seconds(many, 32, dataclasses.replace(timed, machines=2)) == pytest.approx(
        0.02 + (768 * 0.004 + 768 * 11 * 1e-4) / 4)
    assert estimates(many, SMALL, timed, 100, 8)["store"] == store_seconds(many, 32, timed)
    before = costs({SMALL: 100})  # plans made before: no timed job
    assert store_seconds(many, 32, before) == pytest.approx(many.frames * (1e-4 + 1e-4) / 2)

    notes = [{"worker": 7, "begin": 1.0, "seconds": 0.2, "further": 99, "frames": 300},
             {"worker": 7, "begin": 1.5, "seconds": 0.1, "further": 99, "frames": 100},
             {"worker": 8, "begin": 1.2, "seconds": 0.4, "further": 49, "frames": 50}]
    start, video, further = store_figures(notes, started=0.9, ended=2.0)
    assert start == pytest.approx(0.2)  # (1.0 + 1.2) / 2 - 0.9
    assert video == pytest.approx(((2.0 - 1.0) + (2.0 - 1.2) - 0.7) / 3)
    assert further == pytest.approx((300 * 0.2 / 99 + 100 * 0.1 / 99 + 50 * 0.4 / 49) / 450)


def test_the_flow_is_counted_from_its_job_timed_as_it_runs():
    """The flow's estimate: the job's start, then each video's own part and its frame pairs at their costs in the
    job, split between machines; plans made before, each pair solved and JPEG-encoded over the workers. The figures
    come from three timed jobs (one video of one pair; K of one pair; V of P pairs in all); none below 0. The
    embedding and the curation's copies pay a call's own cost once a chunk of a video."""
    from coclr.learn.budget import estimates, flow_calls, flow_job_figures, flow_seconds

    many = footage(videos=768, frames=12)
    before = costs({SMALL: 100})
    timed = dataclasses.replace(before, flow_job={32: 0.07}, flow_video={32: 0.003}, flow_next={32: 2e-3})
    assert flow_seconds(many, 32, timed) == pytest.approx(0.07 + 768 * 0.003 + 768 * 11 * 2e-3)
    assert flow_seconds(many, 32, dataclasses.replace(timed, machines=2)) == pytest.approx(
        0.07 + (768 * 0.003 + 768 * 11 * 2e-3) / 2)
    assert estimates(many, SMALL, timed, 100, 8)["flow"] == flow_seconds(many, 32, timed)
    assert flow_seconds(many, 32, before) == pytest.approx(768 * 11 * (1e-3 + 1e-4 / 2))

    start, video, pair, short, long, pairs = 0.07, 0.003, 2e-3, 32, 16, 128
    seconds = [start + video + pair, start + short * (video + pair), start + long * video + pairs * pair]
    assert flow_job_figures(seconds, short, long, pairs) == pytest.approx((start, video, pair))
    assert min(flow_job_figures([0.5, 0.4, 0.45], short, long, pairs)) == 0.0  # a slow first job: nothing negative

    assert flow_calls([12, 32, 33, 1, 100]) == 1 + 1 + 2 + 0 + 4  # a call per chunk of 32 frames; no pair, no call
    calls = dataclasses.replace(timed, flow_call={32: 1e-3})
    assert estimates(many, SMALL, calls, 100, 8)["embed"] - estimates(many, SMALL, timed, 100, 8)["embed"] == (
        pytest.approx(768 * 1e-3))
    assert calibration_seconds(many, SMALL, calls, 2) - calibration_seconds(many, SMALL, timed, 2) == pytest.approx(
        2 * len(ALTERATIONS) * 1e-3)


def test_the_flow_job_is_timed_on_a_temporary_store_of_the_sampled_frames(monkeypatch):
    """The flow job's timing runs the job (as ``coclr learn`` runs it, with the workers given) on a temporary store it
    removes: a first job untimed, then one video of one pair, K videos of one pair (the videos' first pairs in
    turn), every frame of each video; the figures come back from a job whose seconds follow the costs. None when no
    video has two pairs."""
    import types

    from coclr.learn import budget
    from coclr.store import flow_extract
    from coclr.store.clipstore import ClipStore

    clock = [0.0]
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    jobs = []

    def job(root, backend, workers, keys):  # a job of 0.07 s, 3 ms a video, 2 ms a pair
        store = ClipStore(root)
        frames = [store.num_frames(key, "rgb") for key in keys]
        jobs.append((backend, workers, frames, store.frame_size(keys[0], "rgb")))
        clock[0] += 0.07 + 0.003 * len(keys) + 0.002 * sum(count - 1 for count in frames)

    monkeypatch.setattr(flow_extract, "extract_flow", job)
    made = temporary_folders(monkeypatch)
    rng = np.random.default_rng(0)
    videos = [list(rng.integers(0, 255, (count, 32, width, 3), dtype=np.uint8)) for count, width in
              ((9, 40), (5, 32), (1, 32))]
    start, video, pair = budget._time_flow_job(videos, 3)
    assert (start, video, pair) == pytest.approx((0.07, 0.003, 0.002))
    assert [frames for _, _, frames, _ in jobs] == [[2], [2], [2] * budget.FLOW_KEYS, [9, 5]]  # (one too short)
    assert {(backend, workers) for backend, workers, _, _ in jobs} == {("auto", 3)} and jobs[0][3] == (32, 40)
    assert len(made) == 1 and not Path(made[0]).exists()
    assert budget._time_flow_job([videos[2], videos[2][:1] * 2], 3) is None  # one pair a video at most
    assert budget.flow_job_costs([videos[2]], 3) is None


def test_the_flow_job_timing_runs_the_real_job(monkeypatch):
    """The timing's jobs are the flow extraction itself (its checks pass on the temporary store; its flow written)."""
    from coclr.learn import budget

    made = temporary_folders(monkeypatch)  # (not tempfile.tempdir: the job's decoding workers' own folder follows it)
    monkeypatch.setattr(budget, "FLOW_KEYS", 4)
    rng = np.random.default_rng(0)
    videos = [list(rng.integers(0, 255, (4, 32, 40, 3), dtype=np.uint8)) for _ in range(2)]
    start, video, pair = budget._time_flow_job(videos, 1)
    assert 0 <= start < 60 and 0 <= video < 5 and 0 <= pair < 1
    assert len(made) == 1 and not Path(made[0]).exists()


def temporary_folders(monkeypatch) -> list[str]:
    """The calibration's folders ``tempfile.TemporaryDirectory`` makes from now on (to check that they are gone).
    Others are not counted: on a fresh machine the first build of a C kernel makes its own in the kernel cache."""
    import tempfile

    made = []
    real = tempfile.TemporaryDirectory

    def folder(*args, **kwargs):
        created = real(*args, **kwargs)
        if Path(created.name).name.startswith("coclr-learn-calibration"):
            made.append(created.name)
        return created

    monkeypatch.setattr(tempfile, "TemporaryDirectory", folder)
    return made


def test_the_flow_is_timed_on_first_frames_no_larger_than_the_largest_clip(tmp_path):
    """The flow's sampled frames are kept in memory: at most the largest candidate's side (a smaller video as it
    is); an unreadable video gives none."""
    from coclr.learn import budget
    from coclr.video.decode import write_mp4

    rng = np.random.default_rng(0)
    large = write_mp4(tmp_path / "large.mp4", rng.integers(0, 255, (6, 240, 320, 3), dtype=np.uint8), fps=10)
    small = write_mp4(tmp_path / "small.mp4", rng.integers(0, 255, (6, 48, 64, 3), dtype=np.uint8), fps=10)
    largest = max(model.size for model in MODELS)
    assert [frame.shape for frame in budget._first_frames(str(large), 4)] == [(largest, 171, 3)] * 4
    assert [frame.shape for frame in budget._first_frames(str(small), 9)] == [(48, 64, 3)] * 6
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    assert budget._first_frames(str(tmp_path / "broken.mp4"), 4) == []


def test_the_flow_pairs_are_timed_in_calls_of_a_chunk_and_alone(monkeypatch):
    """A pair's flow and a call's own cost: every pair of the sampled videos solved in calls of up to a chunk of one
    frame size, and each video's first pair in a call of its own; recovered from calls whose seconds follow them."""
    import types

    import torch

    from coclr.embed.embedder import CHUNK_FRAMES
    from coclr.flow import tvl1
    from coclr.learn import budget

    clock = [0.0]
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    calls = []

    def solve(previous, following):  # 1 ms a call, 2 ms a pair
        calls.append((len(previous), tuple(previous.shape[1:])))
        clock[0] += 0.001 + 0.002 * len(previous)

    monkeypatch.setattr(tvl1, "tvl1_flow", solve)
    grays = [torch.zeros(41, 32, 40), torch.zeros(3, 32, 32), torch.zeros(2, 32, 40)]
    assert budget._time_flow_pairs(grays) == pytest.approx((0.002, 0.001))
    assert calls == [(CHUNK_FRAMES, (32, 40)), (41 - CHUNK_FRAMES, (32, 40)), (2, (32, 32)),  # 40 + 1 pairs; 2
                     (1, (32, 40)), (1, (32, 32)), (1, (32, 40))]


def test_the_embedding_is_counted_from_its_own_network_and_the_stores_decoding():
    """The embedding's estimate: two passes of decoding, each as the store job's (timed in the job's workers), the
    flow, three forwards per window through the embedding's own network, four encoders loaded; plans made before,
    one process's decoding over the workers and the training encoder's forward. The curation's calibration counts
    the same network, and its two encoders once when it embeds any copy."""
    from coclr.learn.budget import estimates, store_seconds, windows_of

    many = footage(videos=768, frames=12)
    before = costs({SMALL: 100})
    timed = dataclasses.replace(before, store_job={32: 0.02}, store_video={32: 0.004}, store_next={32: 1e-4},
                                embed_forward={SMALL.key: 2e-4}, embed_load={SMALL.key: 0.05})
    windows, pairs = windows_of(many, SMALL), many.frames - many.videos
    assert estimates(many, SMALL, timed, 100, 8)["embed"] == pytest.approx(
        2 * store_seconds(many, 32, timed) + pairs * 1e-3 + 3 * windows * 2e-4 + 4 * 0.05)
    assert estimates(many, SMALL, before, 100, 8)["embed"] == pytest.approx(
        2 * many.frames * 1e-4 / 2 + pairs * 1e-3 + 3 * windows * before.forward[SMALL.key])
    forwards = calibration_seconds(many, SMALL, timed, 2) - calibration_seconds(
        many, SMALL, dataclasses.replace(timed, embed_forward={SMALL.key: 0.0}), 2)
    assert forwards == pytest.approx(2 * len(ALTERATIONS) * 2 * 12 / (SMALL.length // 2) * 2e-4)
    assert calibration_seconds(many, SMALL, timed, 0) == 0.0  # no copy, no encoder loaded


def test_the_embeddings_network_is_timed_as_the_embedding_builds_it(tmp_path, monkeypatch):
    from coclr.learn import budget
    from coclr.models import inference

    built = []
    real = inference.inference_network
    monkeypatch.setattr(inference, "inference_network", lambda *args, **kwargs: built.append(args) or real(*args,
                                                                                                            **kwargs))
    forward, load = budget._time_embedding(SMALL, "cpu", tmp_path / "timing")
    assert 0 < forward < 1 and 0 < load < 60
    assert len(built) == budget.REPEATS + 1 and all(args[1] is None and str(args[2]) == "cpu" for args in built)
    assert len(list((tmp_path / "timing").glob("embed*.pth"))) == budget.REPEATS + 1  # a file of its own each time


def test_the_store_job_is_timed_in_its_own_workers_on_the_first_frames(tmp_path, capsys, monkeypatch):
    """The store's timing runs the store job (its pool, the entries written) on the sampled videos' first frames, in
    a temporary store it removes, with no progress bar of its own; None when no video can be read."""
    import tempfile

    from coclr.learn import budget
    from coclr.video.decode import write_mp4

    rng = np.random.default_rng(0)
    videos = [str(write_mp4(tmp_path / f"v{length}.mp4", rng.integers(0, 255, (length, 48, 64, 3), dtype=np.uint8),
                            fps=10)) for length in (6, 30)]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(budget, "STORE_FRAMES", 20)
    seen = []
    real = budget.store_figures
    monkeypatch.setattr(budget, "store_figures", lambda notes, *times: seen.extend(notes) or real(notes, *times))
    start, video, further = budget._time_store(videos, 32, 2, key_seconds=0.01)
    assert 0 < start < 60 and 0 < video < 5 and 0 < further < 1
    assert sorted(note["further"] for note in seen)[:: len(seen) - 1] == [5, 19]  # the first 20 frames at most
    assert {note["frames"] for note in seen} == {6, 30} and len(seen) == 2 * 20  # 0.2 s of two workers' 0.01 s keys
    assert len({note["worker"] for note in seen}) == 2 and os.getpid() not in {note["worker"] for note in seen}
    assert list(scratch.iterdir()) == [] and capsys.readouterr().err == ""
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    assert budget._time_store([str(tmp_path / "broken.mp4")], 32, 2, key_seconds=0.01) is None


def test_the_curations_thumbnails_count_per_video_on_a_thread_per_core():
    from coclr.curate.run import CurateOptions

    many = footage(videos=3000)
    measured = dataclasses.replace(costs({SMALL: 100}), thumbnail=0.05)  # (timed with a thread per worker)
    alone = curate_seconds(many, SMALL, measured, 0)
    assert alone == pytest.approx(min(3000, CurateOptions.thumbnails) * 0.05)
    unmeasured = dataclasses.replace(measured, thumbnail=0.0)  # not timed: a decode of every frame
    assert curate_seconds(many, SMALL, unmeasured, 0) == pytest.approx(many.frames * measured.decode_frame / 2)
    fingerprinted = dataclasses.replace(measured, fingerprint={SMALL.key: 0.02})  # every video; calibrating, every copy
    assert curate_seconds(many, SMALL, fingerprinted, 0) == pytest.approx(alone + 3000 * 0.02)
    assert curate_seconds(many, SMALL, fingerprinted, 2) - calibration_seconds(many, SMALL, fingerprinted, 2) == \
        pytest.approx(alone + (3000 + 2 * len(ALTERATIONS)) * 0.02)
    started = dataclasses.replace(fingerprinted, thumbnail_start=0.3, fingerprint_start={SMALL.key: 0.2})
    assert curate_seconds(many, SMALL, started, 0) == pytest.approx(alone + 0.3 + 0.2 + 3000 * 0.02)  # once each


def test_a_pipeline_runs_sized_stages_and_a_warm_up_never_longer_than_its_stage():
    from coclr.config import from_dict
    from coclr.learn.recipe import DECAY_SHARE, milestones, pipeline_options, sized
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import check_sized, plan_stages, stage_config

    plan = Plan.from_dict({**TINY_PLAN, "epochs": {"infonce": 4, "coclr": 8}})
    config = from_dict(PipelineConfig, pipeline_options(plan, "store", "out", 0, "cpu", 16))
    stages = plan_stages(config)
    assert config.optim.warmup_epochs == 4 and stages[2].milestones == milestones(8, DECAY_SHARE["coclr"]) == [6]
    short = [*stages[:2], *(sized(stage, 3) for stage in stages[2:])]
    assert check_sized(stages, short) == short and short[2].epochs == 3 and short[2].milestones == [2]
    made = stage_config(config, short[2], Path("out"))
    # cut to 3 of 8 epochs, its warm-up and own-key phase shrink with it, the plan's shape kept: the whole stage was
    # warm-up, and its own key never dropped (own_positive_epochs 6 of a 3-epoch stage planned as 6 of 8)
    planned = stage_config(config, stages[2], Path("out"))
    assert (made.optim.epochs, made.optim.milestones) == (3, [2])
    assert made.optim.warmup_epochs == pytest.approx(planned.optim.warmup_epochs * 3 / 8)
    assert made.optim.warmup_epochs < 3
    assert made.method.own_positive_epochs == pytest.approx(planned.method.own_positive_epochs * 3 / 8)
    longer = stage_config(config, sized(stages[2], 12), Path("out"))  # sized longer: as planned
    assert (longer.optim.warmup_epochs, longer.method.own_positive_epochs) == \
        (planned.optim.warmup_epochs, planned.method.own_positive_epochs)
    # its jobs' records name the store and the folder absolutely: `coclr task` runs them from any folder (a
    # relative "learn/store" was "not a directory" from another one)
    assert config.data.store == os.path.abspath("store") and config.run.out == os.path.abspath("out")
    assert stage_config(config, stages[0], Path("out")).optim.warmup_epochs == 4  # the others as configured
    with pytest.raises(ValueError):
        check_sized(stages, [*stages[:2], *(dataclasses.replace(stage, lr=1.0) for stage in stages[2:])])


def test_the_side_by_side_calibration_times_two_real_processes() -> None:
    """The calibration of the InfoNCE stages side by side starts two timing tasks as every job starts
    (``coclr task``), one thread each, and reads their step and start times; a child that fails is one line."""
    from coclr.learn.budget import Model, _time_side_by_side

    model = Model(0.125, 32, 8)  # the smallest S3D takes
    step, started = _time_side_by_side(model, batch=2, steps=1)
    assert 0 < step < 60 and 0 < started < 300
    failing = dataclasses.replace(model, width=-1.0)  # refused in the child, by the model's options
    with pytest.raises(ConfigError, match="the calibration of two processes side by side failed: .*width"):
        _time_side_by_side(failing, batch=2, steps=1)


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


# ------------------------------------------------------------------------------------------ the exported stage


def _stage(view: str, collapsed: bool = False, **measures) -> dict:
    return {"view": view, "method": "x", "collapsed": collapsed, **measures}


def test_the_exported_stage_is_never_a_collapsed_one_and_is_said_why():
    from coclr.learn.stages import choose_exports, export_line

    stages = {"infonce_rgb": _stage("rgb", agreement=0.2), "infonce_flow": _stage("flow", agreement=0.5),
              "cycle1_rgb": _stage("rgb", agreement=0.4), "cycle1_flow": _stage("flow", agreement=0.3),
              "cycle2_rgb": _stage("rgb", True, agreement=0.9), "cycle2_flow": _stage("flow", True)}
    last = choose_exports(stages, "last")
    assert {view: entry["stage"] for view, entry in last.items()} == {"rgb": "cycle1_rgb", "flow": "cycle1_flow"}
    assert last["flow"]["reason"].startswith("cycle2_flow collapsed") and not last["flow"]["collapsed"]
    best = choose_exports(stages, "agreement")
    assert best["rgb"]["stage"] == "cycle1_rgb" and best["flow"]["stage"] == "infonce_flow"  # cycle2_rgb collapsed
    assert "exported infonce_flow as encoder_flow (cycle2_flow collapsed; the best agreement" in export_line(best)
    lower = choose_exports({"a_rgb": _stage("rgb", alignment=0.3), "b_rgb": _stage("rgb", alignment=0.1),
                            "c_rgb": _stage("rgb", alignment=None)}, "alignment")
    assert lower["rgb"]["stage"] == "b_rgb"  # lower alignment is better; a stage without a value ranks last
    ties = choose_exports({"a_rgb": _stage("rgb", rankme=2.0), "b_rgb": _stage("rgb", rankme=2.0)}, "rankme")
    assert ties["rgb"]["stage"] == "b_rgb"  # ties to the later stage
    dead = choose_exports({"infonce_flow": _stage("flow", True), "cycle1_flow": _stage("flow", True)})
    assert dead["flow"] == {"stage": "cycle1_flow", "collapsed": True, "reason": dead["flow"]["reason"]}
    assert "every flow stage collapsed" in dead["flow"]["reason"]


def test_a_view_whose_every_stage_collapsed_is_said_and_makes_the_run_exit_3(tmp_path, capsys, monkeypatch):
    from coclr.cli import main
    from coclr.learn import run
    from coclr.learn.run import LearnSummary

    record = {"stages": {"infonce_flow": _stage("flow", True), "cycle1_flow": _stage("flow", True)},
              "exported": {"rgb": {"stage": "cycle1_rgb", "collapsed": False, "reason": "the last stage"},
                           "flow": {"stage": "cycle1_flow", "collapsed": True, "reason": "every flow stage collapsed"}}}
    summary = LearnSummary(tmp_path, 8, [], 12.0, record=record)
    assert summary.collapsed_views == ["flow"]
    spaced = tmp_path / "my learn"  # the command it suggests runs pasted into a shell
    assert f"(coclr search '{spaced / 'embeddings' / 'two_stream'}' --query VIDEO)" in str(
        LearnSummary(spaced, 8, [], 12.0, record=record))
    assert "every flow stage collapsed: encoder_flow.pth and the embeddings from it carry nothing; try a longer " \
           "--budget" in str(summary)
    monkeypatch.setattr(run, "learn", lambda *args, **kwargs: summary)
    monkeypatch.setattr("coclr.learn.learn", lambda *args, **kwargs: summary)
    assert main(["learn", str(tmp_path), "--out", str(tmp_path / "out")]) == 3
    assert "every flow stage collapsed" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ the labels


def _labels_file(tmp_path: Path, text: str | bytes, name: str = "labels.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_labels_absolute_paths_a_byte_order_mark_and_notes(tmp_path):
    from coclr.learn.scores import read_labels

    videos = [str(tmp_path / "v" / f"clip{i}.mp4") for i in range(4)]
    (tmp_path / "v").mkdir()
    for path in videos:
        Path(path).write_bytes(b"x")
    rows = f"path,label,split\nv/clip0.mp4,jump,train\n{videos[1]},run,test\nv/clip2.mp4,,train\nelsewhere.mp4,run,\n"
    labels, notes = read_labels(str(_labels_file(tmp_path, "\ufeff" + rows)), videos)  # Excel's CSV UTF-8
    assert labels["classes"] == ["jump", "run"]
    assert labels["videos"] == {videos[0]: (0, "train"), videos[1]: (1, "test")}
    assert any("1 row(s) name videos that are not among the inputs" in n and "elsewhere.mp4" in n for n in notes)
    assert any("1 row(s) have no label" in n and "line 4" in n for n in notes)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "v")
    labels, _ = read_labels(str(_labels_file(tmp_path, f"{link}/clip2.mp4,3\nv/clip3.mp4,1\n")), videos)
    # through a link; integer labels are the classes the videos have ("1" and "3": two, not "0".."3")
    assert labels["classes"] == ["1", "3"] and labels["videos"] == {videos[2]: (1, "train"), videos[3]: (0, "train")}


def test_bad_labels_files_are_one_line_naming_the_file(tmp_path):
    from coclr.errors import DataError
    from coclr.learn.scores import read_labels

    videos = [str(tmp_path / f"clip{i}.mp4") for i in range(3)]
    text = "path,label\nclip0.mp4,a\nclip1.mp4,b\n"
    cases = {
        "utf16.csv": (text.encode("utf-16"), "UTF-16 text, not UTF-8; save it as UTF-8"),
        "utf16be.csv": (text.encode("utf-16-be"), "UTF-16 text, not UTF-8"),  # (no byte-order mark)
        "labels.xlsx": (b"PK\x03\x04\x14\x00\x00\x00" + b"<x/>" * 50, r"not a text file \(a ZIP archive: a "
                        r"spreadsheet's .xlsx\?\); save it as CSV"),  # (it was "UTF-16 text")
        "binary.csv": (bytes(range(256)) * 4, r"not a text file; save it as CSV"),
        "gone.csv": (None, r"^--labels .*gone\.csv: .*"),  # (it named no option: "gone.csv: manifest not found")
        "latin.csv": ("path,label\nclip0.mp4,caf\xe9\n".encode("latin-1"), r"not UTF-8 text \(byte 0xe9 at offset"),
        "split.csv": ("clip0.mp4,a,holdout\nclip1.mp4,b\n,c\n", r"2 malformed row\(s\): line 1 \(split 'holdout'\), "
                      r"line 3 \(no path\)"),
        "one.csv": ("clip0.mp4,a\nother.mp4,b\n", r"1 of its rows label an input video .* at least 2 are needed"),
        "wide.csv": ("clip0.mp4,a,train,g1,extra\n", r"wide.csv:1: expected path,label,split,group"),
        "twice.csv": ("clip0.mp4,a\nclip1.mp4,b\nclip0.mp4,b\n",
                      r"1 malformed row\(s\): line 3 \(clip0.mp4 is 'b'/train, line 1 says 'a'/train\)"),
        "repeated.csv": ("clip0.mp4,a\nclip0.mp4,a\n", r"1 of its rows label an input video"),  # one video: once
        "semicolons.csv": ("path;label\nclip0.mp4;a\nclip1.mp4;b\n", r"its rows are separated by semicolons: save it "
                           "with commas"),  # as European spreadsheets save it
        "tabs.csv": ("clip0.mp4\ta\nclip1.mp4\tb\n", r"its rows are separated by tabs"),
    }
    for name, (content, message) in cases.items():
        path = _labels_file(tmp_path, content, name) if content is not None else tmp_path / name
        with pytest.raises(DataError, match=message) as error:
            read_labels(str(path), videos)
        assert str(path) in str(error.value) and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------- progress and time


def test_the_eta_follows_the_pace_of_the_phase_under_way(monkeypatch):
    """A phase that goes three times slower than estimated: once it has reported some work, the ETA is its
    remainder at that pace plus the later phases at the run's pace, not the estimates scaled by the whole run's
    average."""
    from coclr.learn import line as module
    from coclr.learn.line import ProgressLine

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    estimates = {"measure": 10.0, "store": 10.0, "infonce": 100.0, "coclr": 100.0}
    with ProgressLine(estimates, enabled=False, done=("measure",)) as line:
        assert line.eta() == pytest.approx(210.0)
        with line.phase("store", 10):
            now[0] += 10.0
            line.observe("store", 10, 10)
        assert line.eta() == pytest.approx(200.0)  # as estimated so far
        with line.phase("infonce", 400):  # both side-by-side stages' epochs
            now[0] += 60.0
            line.observe("InfoNCE", 80, 400)  # a fifth of the work in 60 s: 3x the estimate
            remaining, pace = 80.0 * 3.0, (10 + 10 + 60) / (10 + 10 + 20)
            assert line.eta() == pytest.approx(remaining + 100.0 * pace)
            now[0] += 180.0
            line.observe("InfoNCE", 320, 400)
        assert line.eta() == pytest.approx(100.0 * (10 + 10 + 240) / 120)
        with line.phase("coclr", 100):  # its stages sized as they start: twice the steps, twice the seconds
            line.resize(200, 200.0)
            now[0] += 50.0
            line.observe("stage", 50, 100)
            assert line.credited == pytest.approx(50.0) and line.eta() == pytest.approx(150.0)
        assert line.estimates["coclr"] == 200.0 and line.bar.total == pytest.approx(320.0)


def test_the_eta_keeps_a_phase_sized_to_the_time_left_at_its_estimate(monkeypatch):
    """learn's CoCLR stages are sized to the time left as they start: a slow InfoNCE stretched their estimate by its
    pace (the line said 6 minutes left where 2 were)."""
    from coclr.learn import line as module
    from coclr.learn.line import ProgressLine

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    estimates = {"measure": 10.0, "infonce": 100.0, "coclr": 100.0, "embed": 20.0}
    with ProgressLine(estimates, enabled=False, done=("measure",), sized=("coclr",)) as line:
        with line.phase("infonce", 100):
            now[0] += 300.0
            line.observe("InfoNCE", 100, 100)  # three times its estimate
        pace = (10 + 300) / (10 + 100)
        assert line.eta() == pytest.approx(100.0 + 20.0 * pace)  # (it was (100 + 20) x pace)


def test_a_resumed_runs_line_counts_its_earlier_parts(monkeypatch, capfd):
    """Phases finished by a run's earlier parts were credited again at the seconds their resumed runs took (none),
    so the pace fell to nothing ("about 00:03 left" with a minute to go), and "so far" began at the measurement."""
    from coclr.learn import line as module
    from coclr.learn.line import ProgressLine

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    estimates = {"measure": 10.0, "store": 10.0, "infonce": 100.0, "coclr": 100.0}
    took = {"store": 30.0, "infonce": 290.0}  # the earlier part's: three times the estimates
    with ProgressLine(estimates, enabled=False, done=("measure", *took), took=took, before=400.0) as line:
        pace = (10.0 + 30.0 + 290.0) / (10.0 + 10.0 + 100.0)
        assert line.eta() == pytest.approx(100.0 * pace)
        for name in took:  # run again: they find their work done
            with line.phase(name, 10):
                now[0] += 0.5
                line.observe(name, 10, 10)
        assert line.eta() == pytest.approx(100.0 * pace) and line.bar.n == pytest.approx(120.0)
    capfd.readouterr()
    with ProgressLine(estimates, enabled=True, done=("measure", *took), took=took, before=400.0) as line:
        assert line.bar.format_dict["elapsed"] >= 400.0  # "so far": the whole run's time, as learn.json counts it
    drawn = capfd.readouterr().err
    assert "06:40 so far" in drawn and "00:00 so far" not in drawn  # not drawn before its clock was set


def test_a_phase_that_reports_nothing_counts_its_eta_down(monkeypatch):
    """The quality measures and the curation report no units: the ETA is their estimate at the pace of the run
    before them, less the time they have run, and the line is drawn again while nothing reports."""
    from coclr.learn import line as module
    from coclr.learn.line import ProgressLine

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    estimates = {"measure": 10.0, "store": 10.0, "curate": 20.0, "fixed": 5.0}
    with ProgressLine(estimates, enabled=False, done=("measure",)) as line:
        with line.phase("store", 10):
            now[0] += 20.0  # twice its estimate: the pace is 1.5 after it (30 s for 20)
            line.observe("store", 10, 10)
        with line.phase("curate", None):
            assert line.eta() == pytest.approx(20.0 * 1.5 + 5.0 * 1.5)
            now[0] += 12.0
            assert line.eta() == pytest.approx(18.0 + 7.5)  # counting down
            now[0] += 30.0  # past its estimate at that pace: the later phase at the pace so far
            assert line.eta() == pytest.approx(5.0 * (30.0 + 42.0) / (20.0 + 20.0))
    drawn = []
    monkeypatch.setattr(module, "REDRAW_SECONDS", 0.01)
    monkeypatch.setattr(ProgressLine, "_show", lambda self: drawn.append(1))
    with ProgressLine(estimates, enabled=True, done=("measure",)) as line, line.phase("curate", None):
        deadline = time.perf_counter() + 5
        while len(drawn) < 5 and time.perf_counter() < deadline:
            time.sleep(0.01)
    assert len(drawn) >= 5  # drawn again with no update
    count = len(drawn)
    time.sleep(0.05)
    assert len(drawn) == count  # and no more once closed


def test_the_measurement_predicts_what_is_left_and_the_clock_counts_every_part(tmp_path):
    from coclr.learn.budget import _affordable, measuring_left, still_measured, work
    from coclr.learn.run import Clock, read_result

    assert measuring_left([], MODELS, footage(), costs({m: 10 for m in MODELS}), 900) is None
    rich = costs({m: 0.01 for m in MODELS})  # every candidate affords the target: all are predicted
    assert measuring_left([(MODELS[0], 8.0)], MODELS[1:], footage(), rich, 1e6) == pytest.approx(
        sum(8.0 * (work(m) / work(MODELS[0])) ** 0.5 for m in MODELS[1:]))
    assert measuring_left([(MODELS[0], 8.0)], MODELS[1:], footage(), rich, 900) < 900  # within the seconds left
    two = [(MODELS[0], 8.0), (MODELS[1], 16.0)]  # twice the time for four times the work: the power is 0.5
    assert measuring_left(two, MODELS[2:3], footage(), rich, 900) == pytest.approx(16.0 * 2.0)
    poor = costs({m: 10_000 for m in MODELS})  # nothing affords the target: no other one is measured
    assert measuring_left([(MODELS[0], 8.0)], MODELS[1:], footage(), poor, 900) == 0.0
    assert still_measured([], MODELS, footage(), poor, 900) == [(MODELS[0], 0.0)]  # the first one always
    # The next network affords the target in the seconds left, but not after its own measurement: not measured.
    scale = (work(MODELS[1]) / work(MODELS[0])) ** 0.5
    edge = costs({MODELS[0]: 10})
    left = next(seconds for seconds in range(100, 100_000, 10)
                if _affordable(footage(), MODELS[0], edge, seconds) / scale >= TARGET_STEPS)
    measuring = (left - 1) * 0.5  # a measurement of the next one predicted to take half what is left
    assert _affordable(footage(), MODELS[0], edge, left - measuring * scale) / scale < TARGET_STEPS
    assert still_measured([(MODELS[0], measuring)], MODELS[1:], footage(), edge, left) == []
    assert still_measured([(MODELS[0], 0.1)], MODELS[1:2], footage(), edge, left + 10) == [(MODELS[1], 0.1 * scale)]
    clock = Clock(tmp_path, 100.0, time.perf_counter() - 5.0)
    clock.record({"status": "running"})
    assert 105.0 <= read_result(tmp_path)["seconds"] < 110.0  # the earlier parts' 100 s and this part's 5 s
    clock.record({"status": "x"}, due=True)  # not due yet: nothing written
    assert read_result(tmp_path)["status"] == "running"


def test_an_output_folder_that_cannot_be_written_is_refused_at_once(tmp_path, monkeypatch):
    from coclr.runfolder import FolderRefused, check_writable

    (tmp_path / "file").write_text("x")
    with pytest.raises(FolderRefused, match="is a file, not a folder"):
        check_writable(tmp_path / "file" / "out")
    check_writable(tmp_path / "new" / "deeper")  # created later, under a folder that may be written
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(FolderRefused, match=r"where it would be created, cannot be written by this user"):
        check_writable(tmp_path / "new")


def test_videos_shorter_than_a_clip_are_listed_and_most_of_them_refused():
    from coclr.errors import DataError
    from coclr.learn.run import short_videos

    plan = choose_plan(footage(), costs({SMALL: 100}), 900)
    infos = [SimpleNamespace(frames=n) for n in (3, 9, 40, 8, 100)]
    paths = [f"v{i}.mp4" for i in range(5)]
    assert short_videos(plan.model.length, paths, infos) == ["v0.mp4", "v3.mp4"]  # 8 frames + 1 for flow
    assert "warning: 1 video(s) shorter than one clip" in dataclasses.replace(plan, short_videos=["a"]).describe()
    with pytest.raises(DataError, match=r"3 of the 4 videos are shorter than one clip \(9 frames"):
        short_videos(plan.model.length, paths[:4], [SimpleNamespace(frames=n) for n in (3, 9, 2, 4)])


def test_most_videos_shorter_than_any_clip_are_refused_before_measuring(tmp_path, monkeypatch):
    """The refusal came after 41 s of measuring (decoding, TV-L1 and training timed) though the frame counts were
    known from the probe."""
    from coclr.errors import DataError
    from coclr.learn import run

    def measured(*args, **kwargs):
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(run, "measure_costs", measured)
    monkeypatch.setattr("coclr.video.decode.probe_video", lambda path: SimpleNamespace(frames=3 if "s" in path else 90))
    with pytest.raises(DataError, match=r"6 of the 9 videos are shorter than one clip \(9 frames"):
        run.make_plan([*(f"s{n}.mp4" for n in range(6)), "long1.mp4", "long2.mp4", "long3.mp4"], 900, "cpu", 1, 0.0,
                      show=False)


def test_too_few_readable_videos_are_refused_before_measuring_naming_the_unreadable(monkeypatch):
    """Seven readable videos of nine were refused after 75 s of measuring, naming none of the two it could not
    read."""
    from coclr.errors import VideoDecodeError
    from coclr.learn import run

    def measured(*args, **kwargs):
        raise AssertionError("measured before refusing")

    def probe(path):
        if "bad" in path:
            raise VideoDecodeError(f"{path}: the file is empty")
        return SimpleNamespace(frames=90)

    monkeypatch.setattr(run, "measure_costs", measured)
    monkeypatch.setattr("coclr.video.decode.probe_video", probe)
    paths = [f"v{number}.mp4" for number in range(7)] + ["bad1.mp4", "bad2.mkv"]
    with pytest.raises(ConfigError, match=r"^7 readable video\(s\) \(2 could not be read: bad1\.mp4, bad2\.mkv\): "
                                          "learning needs at least 8"):
        run.make_plan(paths, 900, "cpu", 1, 0.0, show=False)


def test_a_second_learn_on_a_folder_at_work_is_refused_before_measuring(tmp_path, monkeypatch):
    """The second of two identical commands measured this machine for a minute before the claim refused it."""
    from coclr.learn import LearnOptions, run
    from coclr.runfolder import LOCK_FILE
    from conftest import locked_by_another_process

    def measured(*args, **kwargs):
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(run, "make_plan", measured)
    videos = tmp_path / "videos"
    videos.mkdir()
    for i in range(8):
        (videos / f"v{i}.mp4").write_bytes(b"x")
    out = tmp_path / "out"
    out.mkdir()
    with locked_by_another_process(out / LOCK_FILE) as pid:
        with pytest.raises(DataError, match=rf"another coclr learn is writing this folder \(pid {pid} on"):
            run.learn([str(videos)], out, LearnOptions(progress=False))
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]


def test_a_learn_that_measures_holds_its_folder_and_a_refused_plan_leaves_none(tmp_path, monkeypatch):
    """Two learns started on one new folder both measured this machine (on the same cores: each plan slowed by the
    other) until the second was refused at the claim. The first now holds the folder while it measures; a plan
    refused leaves no folder behind, and an interruption while measuring does not say the timing jobs' own
    temporary videos were "done and kept"."""
    from coclr.errors import ConfigError
    from coclr.interrupts import Interrupted
    from coclr.learn import LearnOptions, run
    from coclr.runfolder import PREPARING_LOCK
    from conftest import locked_by_another_process

    videos = tmp_path / "videos"
    videos.mkdir()
    for i in range(8):
        (videos / f"v{i}.mp4").write_bytes(b"x")
    out = tmp_path / "deep" / "out"

    def refused(*args, **kwargs):  # while measuring: the same command, in another process, is refused at once
        second = subprocess.run([sys.executable, "-m", "coclr", "learn", str(videos), "--out", str(out)],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and "another coclr learn is writing this folder" in second.stderr, second.stderr
        assert "measuring" not in second.stderr
        raise ConfigError("--budget: too small (as a plan refuses it)")

    monkeypatch.setattr(run, "make_plan", refused)
    with pytest.raises(ConfigError, match="too small"):
        run.learn([str(videos)], out, LearnOptions(progress=False))
    assert not (tmp_path / "deep").exists()  # made for the measurement, removed with the refusal
    out.mkdir(parents=True)
    with locked_by_another_process(out / PREPARING_LOCK) as pid:  # another process measuring
        with pytest.raises(DataError, match=rf"another coclr learn is writing this folder \(pid {pid} on"):
            run.learn([str(videos)], out, LearnOptions(progress=False))

    def stopped(*args, **kwargs):  # Ctrl-C in the flow job's timing, which says what that job kept
        raise Interrupted(kept="flow: 32 of 32 videos done and kept")

    monkeypatch.undo()
    monkeypatch.setattr(run, "measure_costs", stopped)
    from coclr.video.decode import write_mp4

    rng = np.random.default_rng(0)
    made = [str(write_mp4(tmp_path / f"m{i}.mp4", rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8), fps=10))
            for i in range(8)]
    with pytest.raises(Interrupted) as caught:
        run.make_plan(made, 900, "cpu", 1, 0.0, show=False)
    assert "done and kept" not in caught.value.kept and "measuring this machine" in caught.value.kept


def test_a_warning_is_one_line_on_the_command_line(capsys):
    import argparse
    import warnings

    from coclr.cli._world import run_command

    def warns(args):
        warnings.warn("the C loops could not be built: no C compiler found\n(set CC)", RuntimeWarning, stacklevel=1)
        return 0

    assert run_command(argparse.Namespace(command="flow", func=warns)) == 0
    err = capsys.readouterr().err
    assert err.strip() == "coclr flow: warning: the C loops could not be built: no C compiler found (set CC)"


@pytest.mark.slow
def test_eight_copies_of_one_video_collapse_and_the_run_says_so(tmp_path, capsys):
    """Every video the same: every stage's features are one point, so no stage is healthy; the run exports the last
    stage of each view marked collapsed, says so in one line and exits with 3, and the report says it at the top."""
    from coclr.cli import main
    from coclr.synth import SynthConfig, write_videos

    write_videos(tmp_path / "data", SynthConfig(num_classes=2, train_scenes=1, test_scenes=1, actions_per_scene=2,
                                                frames=10))
    source = next((tmp_path / "data" / "videos").glob("*.mp4"))
    videos = tmp_path / "copies"
    videos.mkdir()
    for number in range(8):
        shutil.copyfile(source, videos / f"copy{number}.mp4")
    out = tmp_path / "out"
    process = run_learn(videos, out, plan={**TINY_PLAN, "queue": 4})  # 2 iterations an epoch: the queue fills in 1
    output = process.stdout.read()
    assert process.returncode == 0, output  # (the script's status counts failed videos only)
    record = json.loads((out / "learn.json").read_text())
    assert all(entry["collapsed"] for entry in record["stages"].values())
    assert record["exported"] == {view: {"stage": f"cycle2_{view}", "collapsed": True,
                                         "reason": record["exported"][view]["reason"]} for view in ("rgb", "flow")}
    assert all(entry["collapsed"] and entry["encoder_collapsed"] for entry in record["embeddings"].values())
    assert "every flow stage collapsed" in output
    assert main(["learn", str(videos), "--out", str(out), "--budget", "300s"]) == 3
    printed = capsys.readouterr().out
    assert "every rgb stage collapsed: encoder_rgb.pth and the embeddings from it carry nothing; try a longer " \
           "--budget, or more (or longer) videos" in printed
    page = (out / "report.html").read_text()
    assert page.index('class="alarm"') < page.index("<h2>The run</h2>") and "Every flow stage collapsed" in page


@pytest.mark.slow
def test_a_run_that_fits_its_budget_sizes_each_coclr_stage_as_it_starts_and_records_why(tmp_path):
    """A plan that fits its budget: its budget (a second) is spent when the CoCLR stages start, so each is sized to
    one epoch instead of the planned two; plan.json keeps each stage's epochs, learn.json why, and each stage
    trained them (its own record, the pipeline's manifest) with its warm-up no longer than the stage. The plan's
    curation calibrates on no video's copies: the distribution rule sets the threshold."""
    from coclr.synth import SynthConfig, write_videos

    write_videos(tmp_path / "data", SynthConfig(num_classes=2, train_scenes=2, test_scenes=2, actions_per_scene=2,
                                                frames=10))
    out = tmp_path / "out"
    plan = {**TINY_PLAN, "epochs": {"infonce": 1, "coclr": 2}, "steps": 40, "budget": 1.0, "fit_budget": True,
            "curate_videos": 0}
    process = run_learn(tmp_path / "data" / "videos", out, plan=plan)
    assert process.returncode == 0, process.stdout.read()
    coclr = ["cycle1_rgb", "cycle1_flow", "cycle2_rgb", "cycle2_flow"]
    assert json.loads((out / "plan.json").read_text())["stage_epochs"] == dict.fromkeys(coclr, 1)
    record = json.loads((out / "learn.json").read_text())
    assert list(record["sizing"]) == coclr and record["plan"]["stage_epochs"] == dict.fromkeys(coclr, 1)
    assert [entry["measured"] for entry in record["sizing"].values()] == [False, True, True, True]
    assert all(entry["planned"] == 2 and entry["seconds_left"] < 0 for entry in record["sizing"].values())
    assert record["curate"]["rule"].startswith("the distribution rule (--calibrate 0)")  # the plan's: no copies
    assert not (out / "curate" / "calibration").exists()
    manifest = json.loads((out / "pipeline" / "manifest.json").read_text())
    assert [stage["epochs"] for stage in manifest["stages"]] == [1, 1, 1, 1, 1, 1]
    for name in coclr:
        optim = json.loads((out / "pipeline" / name / "run.json").read_text())["options"]["optim"]
        assert optim["epochs"] == 1 and optim["warmup_epochs"] <= 1 and optim["milestones"] == []
        logged = (out / "pipeline" / name / "log.jsonl").read_text().splitlines()
        assert len([line for line in logged if "epoch_seconds" in line]) == 1


# ----------------------------------------------------------------------------------- few videos, many instances


def test_neighbours_outside_a_group_and_their_chance():
    from coclr.eval.label_free import chance_agreement, nearest_others, neighbour_agreement, neighbour_overlap

    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 5))
    groups = np.repeat(np.arange(4), 3)  # four videos of three stretches each
    near = nearest_others(x, 2, groups)
    assert all(groups[j] != groups[i] for i, row in enumerate(near) for j in row)
    mean = x.mean(axis=0)
    unit = (x - mean) / np.linalg.norm(x - mean, axis=1, keepdims=True)
    for i in range(12):  # the slow reference: the best two rows of other videos
        others = sorted((-float(unit[i] @ unit[j]), j) for j in range(12) if groups[j] != groups[i])
        assert list(near[i]) == [j for _, j in others[:2]]
    assert chance_agreement(12, groups) == pytest.approx(1 / 9) and chance_agreement(8) == pytest.approx(1 / 7)
    assert neighbour_agreement(x, 3 * x, groups) == 1.0
    assert neighbour_overlap(x, x, groups=groups) == 1.0


def test_windows_fall_into_the_stretches_training_cut():
    from coclr.data.sampling import instances_of, segment_counts, segments_of
    from coclr.learn.stages import instance_features

    frames = [40, 10, 33]  # usable frames of three videos
    counts = segment_counts(frames, 16)
    cut = segments_of(frames, 16)
    videos = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2])
    starts = np.array([0, 4, 8, 12, 16, 20, 24, 28, 32, 0, 2, 0, 4, 8, 12, 16, 20, 25])
    pairs = instances_of(videos, starts, counts, 16)
    for (video, stretch), start in zip(pairs, starts):  # each window's stretch holds its first frame
        first, length = cut[(cut[:, 0] == video)][stretch, 1:]
        assert first <= start < first + length
    assert instances_of(videos, starts, counts, None)[:, 1].tolist() == [0] * len(videos)
    windows = np.arange(len(videos), dtype=float)[:, None] * np.ones((1, 3))
    found, features, kept, rows = instance_features(windows, pairs, most=100)
    assert found.tolist() == [[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]]
    assert features[0].tolist() == [1.5] * 3  # windows 0-3
    assert np.array_equal(kept, windows) and rows.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4]
    found, features, kept, rows = instance_features(windows, pairs, most=3)  # spread over them
    assert found.tolist() == [[0, 0], [1, 0], [2, 1]] and len(kept) == len(rows) == 9


def test_the_flow_bound_follows_the_footages_motion_and_one_thread_when_it_is_faster():
    from coclr.flow.encode import bound_for
    from coclr.learn.budget import flow_bound, one_thread, schedule

    measured = costs({SMALL: 100})
    assert flow_bound(measured, 32) == bound_for(32) == 5.0 and bound_for(128) == bound_for(256) == 20.0
    measured.motion = {32: 0.9351, 64: 40.0, 112: 1e-4}
    assert flow_bound(measured, 32) == 0.94  # rounded up to two digits
    assert flow_bound(measured, 64) == 10.0 and flow_bound(measured, 112) == pytest.approx(17.5 / 16)
    assert choose_plan(footage(), measured, 900).flow_bound == 0.94
    measured.side_by_side = True
    measured.single_step[SMALL.key], measured.step[SMALL.key] = 0.08, 0.1
    assert one_thread(measured, SMALL.key)
    fast = choose_plan(footage(), measured, 900)
    assert fast.threads == 1 and "CoCLR trains on one thread" in fast.describe()
    measured.single_step[SMALL.key] = 0.12
    slow = choose_plan(footage(), measured, 900)
    assert slow.threads is None and fast.estimates["coclr"] / fast.steps < slow.estimates["coclr"] / slow.steps
    assert schedule(480, 24) == ({"infonce": 4, "coclr": 2}, 384)
    assert schedule(480, 24, up=True) == ({"infonce": 6, "coclr": 3}, 576)  # at least the steps asked for


def test_coclr_on_one_thread_counts_its_miners_forward_on_one_thread():
    """A CoCLR stage that trains on one thread runs its miner's forward on one thread too: its estimate counts the
    one-thread forward (with OpenMP's passive wait a tiny network's forward on two threads took three times it);
    a plan without that figure (made before) counts the forward on every thread."""
    from coclr.learn.budget import estimates, one_thread

    measured = costs({SMALL: 100})
    measured.side_by_side = True
    measured.single_step[SMALL.key], measured.step[SMALL.key] = 0.04, 0.13
    measured.forward[SMALL.key] = 0.0022
    assert one_thread(measured, SMALL.key)
    before = estimates(footage(), SMALL, measured, 1000, 12)
    measured.single_forward[SMALL.key] = 0.0005
    after = estimates(footage(), SMALL, measured, 1000, 12)
    coclr_steps = 1000 - 2 * STAGE_SHARES["infonce"] * 1000
    assert before["coclr"] - after["coclr"] == pytest.approx(coclr_steps * 12 * (0.0022 - 0.0005))
    assert {k: v for k, v in before.items() if k != "coclr"} == {k: v for k, v in after.items() if k != "coclr"}
    measured.single_step[SMALL.key] = 0.2  # every thread is faster: the stage trains on every thread
    assert not one_thread(measured, SMALL.key)
    everywhere = estimates(footage(), SMALL, measured, 1000, 12)
    measured.single_forward.clear()
    assert estimates(footage(), SMALL, measured, 1000, 12) == everywhere


def test_the_quality_measures_count_a_window_read_and_forwarded_on_the_threads_they_run_on():
    """The quality measures' estimate counts each stage's encoder loaded and each sampled window read and forwarded
    as the calibration timed them (:attr:`Costs.window`, :attr:`Costs.load`), on one thread where a forward was
    measured faster there (and the plan says so); a plan without those figures (made before) counts the forward
    on every thread."""
    from coclr.learn.budget import QUALITY_VIDEOS, windows_of

    measured = costs({SMALL: 100})
    measured.forward[SMALL.key], measured.single_forward[SMALL.key] = 0.002, 0.0005
    windows = windows_of(footage(), SMALL) * min(footage().videos, QUALITY_VIDEOS) / footage().videos
    before = choose_plan(footage(), measured, 900)
    assert before.inference_threads is None and "quality measures run on one thread" not in before.describe()
    assert before.estimates["quality"] == pytest.approx(6 * windows * 0.002)
    measured.window[SMALL.key], measured.load[SMALL.key] = 0.0008, 0.014
    plan = choose_plan(footage(), measured, 900)
    assert plan.inference_threads == 1 and "quality measures run on one thread" in plan.describe()
    assert plan.estimates["quality"] == pytest.approx(6 * (windows * 0.0008 + 0.014))
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).inference_threads == 1
    measured.single_forward[SMALL.key] = 0.003  # every thread is faster
    assert choose_plan(footage(), measured, 900).inference_threads is None


def test_the_timed_forward_on_one_thread_and_on_every_thread(tmp_path):
    """time_training times the forward on one thread beside every thread (a CPU of several), both per clip."""
    from coclr.threads import torch_threads
    from coclr.train.timing import time_training

    with torch_threads(2):
        timed = time_training(0.0625, 32, 8, tmp_path / "two", "cpu", 2, steps=1)
    assert timed["forward"] > 0 and timed["single_forward"] > 0
    assert timed["single_forward"] != timed["forward"]  # timed apart
    assert 0 < timed["window"] < 1 and 0 < timed["load"] < 5  # the quality measures' units: a window, a load
    with torch_threads(1):
        alone = time_training(0.0625, 32, 8, tmp_path / "one", "cpu", 2, steps=1)
    assert alone["single_forward"] == alone["forward"] and alone["single_step"] == alone["step"]
    assert (tmp_path / "two" / "epochs" / "log.jsonl").is_file()  # the short run that times an epoch's end
    with torch_threads(1), warnings.catch_warnings():
        warnings.simplefilter("error")  # (its run's queue was as large as its store: warned in every learn)
        steps = time_training(0.0625, 32, 8, tmp_path / "steps", "cpu", 2, steps=1, stages=False)
    assert not (tmp_path / "steps" / "epochs").exists()  # a side-by-side process's timing: the steps alone
    assert "window" not in steps and "load" not in steps


def test_a_network_suits_the_videos_by_its_crop_and_its_clip():
    """A wider network on the smallest's very clip was "not for these videos" when a tenth of them were short (the
    smallest's clip is taken for any footage); the rule is the tenth that docs/learn.md and the plan now say."""
    from coclr.learn.budget import MODELS

    def of(counts: list[int], short_side: int = 32) -> Footage:
        return Footage(len(counts), sum(counts), short_side, 1.0, int(np.percentile(counts, 10)), counts)

    mixed = of([24] * 8 + [6] * 2)  # a fifth are shorter than one 8-frame clip
    assert [mixed.fits(model) for model in MODELS[:3]] == [True, True, False]  # (64 px: above their short side)
    assert of([24] * 8 + [6] * 2, 64).fits(MODELS[2]) and not of([10] * 8, 64).fits(MODELS[3])  # 16 frames
    assert of([40] * 10, 64).fits(MODELS[3])


def test_a_plan_for_few_long_videos_cuts_them_into_instances():
    long = Footage(8, 8 * 200, 240, 1.33, 150, [200] * 8)
    plan = choose_plan(long, costs({SMALL: 100}), 900)
    assert plan.segment_frames == 16 and long.instances(SMALL) == 8 * 12  # 199 frames with flow: 12 stretches
    assert plan.batch == 12 and plan.queue == 32 and plan.topk == 5  # an eighth, a power of two within a third
    assert choose_plan(footage(), costs({SMALL: 100}), 900).batch == 32  # 768 short videos: the study's batch


# --------------------------------------------------------------------------------------- a run from a checkpoint

INIT_RUN = """
import json, sys
import coclr.cli  # the process policy of every entry point
from coclr.learn import LearnOptions, learn
from coclr.learn.budget import Plan
plan = Plan.from_dict(json.loads(sys.argv[3]))
summary = learn([sys.argv[1]], sys.argv[2], LearnOptions(budget=300, plan=plan, workers=0, progress=False,
                labels=sys.argv[4], init=sys.argv[5]))
print(summary)
"""


@pytest.mark.slow
def test_a_run_from_a_checkpoint_measures_it_beside_every_stage_and_keeps_it(learnt, tmp_path):
    from coclr.learn import LearnOptions, learn
    from coclr.models.loading import load_encoder

    videos, labels, source, _ = learnt
    start = tmp_path / "start.pth"
    start.write_bytes((source / "encoder_rgb.pth").read_bytes())
    out = tmp_path / "adapted"
    done = subprocess.run([sys.executable, "-c", INIT_RUN, str(videos), str(out), json.dumps(TINY_PLAN), str(labels),
                           str(start)], capture_output=True, text=True, timeout=600)
    assert "rgb started from" in done.stdout, done.stdout + done.stderr
    record = json.loads((out / "learn.json").read_text())
    assert list(record["stages"])[0] == "init_rgb" and record["stages"]["init_rgb"]["method"] == "init"
    assert "R@1" in record["stages"]["init_rgb"]["labels"] and "R@1" in record["stages"]["cycle2_rgb"]["labels"]
    assert "init" not in record["agreement"]  # one view started from a checkpoint: no pair to agree
    assert record["plan"]["init"]["rgb"]["sha256"] == json.loads((out / "run.json").read_text())["options"]["init"][
        "rgb"]
    copied, _ = load_encoder(out / "init" / "encoder_rgb.pth")
    given, _ = load_encoder(start)
    for (name, ours), theirs in zip(copied.state_dict().items(), given.state_dict().values()):
        assert np.array_equal(ours.numpy(), theirs.numpy()), name
    stage = json.loads((out / "pipeline" / "infonce_rgb" / "run.json").read_text())["options"]
    assert stage["method"]["init_checkpoint"] == str(out / "init" / "encoder_rgb.pth")
    page = (out / "report.html").read_text()
    assert "init_rgb" in page and "Started from" in page and "R@1 (labels, %)" in page
    before = files_digest(out)
    other = encoder_file(tmp_path / "other.pth", "rgb")
    with pytest.raises(ConfigError, match="init.rgb="):  # another starting file: refused, nothing written
        learn([videos], out, LearnOptions(budget=300, plan=Plan.from_dict(TINY_PLAN), init=str(other)))
    with pytest.raises(ConfigError, match="not the starting checkpoint's"):
        wide = encoder_file(tmp_path / "wide.pth", "rgb", width=0.25)
        learn([videos], tmp_path / "new", LearnOptions(budget=300, plan=Plan.from_dict(TINY_PLAN), init=str(wide)))
    assert files_digest(out) == before and not (tmp_path / "new").exists()


def test_a_per_video_cost_is_the_mean_over_the_readable_videos_after_one_untimed_run(monkeypatch):
    """A thumbnail's and a fingerprint's cost per video is the pool's time over the readable sampled videos (they
    differ in length and size), timed after one untimed run on the first readable one (which loads what the work
    needs) and one on each thread (whose excess over a video's cost is the start: a thread's first run costs more);
    an unreadable video is skipped; none readable is (0, 0)."""
    import threading
    import types

    import coclr.learn.budget as budget

    clock = iter(range(1000))
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))  # budget's clock
    seconds = {"a": 5, "bad": 0, "b": 3, "c": 10}  # how long each one's work "takes"
    calls, threads = [], set()

    def work(path: str) -> None:
        calls.append(path)
        if path == "bad":
            raise ValueError("not a video")
        first = threading.get_ident() not in threads  # a thread's first run takes 20 more
        threads.add(threading.get_ident())
        for _ in range(seconds[path] - 1 + 20 * first):  # each call of the clock moves it by one
            next(clock)

    start, each = budget._time_per_video(["bad", "a", "b", "c"], work)
    assert calls == ["bad", "a", "a", "bad", "a", "b", "c"]  # a to load, a on the pool's thread, then each once
    assert each == pytest.approx((4 + 2 + 9 + 1) / 3)  # (5 + 3 + 10) / 3 and the closing call of the clock
    assert start == pytest.approx(5 + 20 - each)  # the pool thread's first run, less a video's share
    assert budget._time_per_video(["bad"], work) == (0.0, 0.0)


def test_options_no_run_could_use_and_too_few_videos_are_refused_before_any_work(tmp_path):
    from coclr.learn import LearnOptions, learn
    from test_embed import moving_square, write_video

    for number in range(6):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    for options, message in ((LearnOptions(seed=-1), "--seed: must be from 0 to 2\\*\\*32 - 1, got -1"),
                             (LearnOptions(workers=-2), "--workers: must be 0 or more .0: work in this process.,"),
                             (LearnOptions(), "6 video.s.: learning needs at least 8")):
        started = time.monotonic()
        with pytest.raises(ConfigError, match=message):
            learn([tmp_path / "videos"], tmp_path / "out", options)
        assert time.monotonic() - started < 5  # before the machine is measured (tens of seconds)
    assert not (tmp_path / "out").exists()
    # A list file naming a video that is not there (it was refused by the store, after the measurement, and the
    # folder it had recorded then refused the mended list as "other videos")
    for number in range(6, 9):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    (tmp_path / "list.txt").write_text("videos/gone.mp4\n")
    gone = tmp_path / "videos" / "gone.mp4"
    with pytest.raises(DataError, match=f"^1 video.s. a list file names do not exist: {gone}; mend the list"):
        learn([tmp_path / "list.txt", tmp_path / "videos"], tmp_path / "out", LearnOptions())
    assert not (tmp_path / "out").exists()
    # A link to nothing in the folder: the whole run was refused as if a list file named it; it is one unreadable
    # video, as in coclr embed (here one of too few)
    for number in (7, 8):
        (tmp_path / "videos" / f"v{number}.mp4").unlink()
    (tmp_path / "videos" / "moved.mp4").symlink_to("nowhere.mp4")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"^7 readable video\(s\) \(1 could not be read: .*moved\.mp4\): learning "
                                          "needs at least 8"):
        learn([tmp_path / "videos"], tmp_path / "out", LearnOptions())
    assert time.monotonic() - started < 5 and not (tmp_path / "out").exists()
    (tmp_path / "videos" / "moved.mp4").unlink()
    for number in (7, 8):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(12, seed=number))
    # a backslash in a name (legal on Linux): refused by the store's index after the measurement, naming no remedy
    write_video(tmp_path / "videos" / "a\\b.mp4", moving_square(12, seed=9))
    started = time.monotonic()
    with pytest.raises(DataError, match=r"a\\b\.mp4: a name with a backslash, which the clip store cannot hold"):
        learn([tmp_path / "videos"], tmp_path / "out", LearnOptions())
    assert time.monotonic() - started < 5 and not (tmp_path / "out").exists()


def test_the_measurement_joins_no_process_group_under_torchrun(monkeypatch, tmp_path):
    """Under torchrun rank 0 measures while the others wait to join the group: a training run timed there joined it
    (WORLD_SIZE was torchrun's), which released the others into collectives that did not match: the job hung."""
    from coclr.train.timing import time_training

    monkeypatch.setenv("WORLD_SIZE", "2")  # (and no MASTER_ADDR: a process that tried to join would fail)
    monkeypatch.setenv("RANK", "0")
    timing = time_training(0.125, 32, 8, tmp_path, "cpu", 2, steps=2, stages=False)
    assert timing["step"] > 0 and os.environ["WORLD_SIZE"] == "2"


def test_labelled_videos_without_a_vector_are_said_and_too_few_score_nothing(tmp_path, monkeypatch):
    """Two labelled videos, one of them unreadable: the run trained for its whole budget and showed no score, and
    said nothing of why ("Scored with the labels of 2 videos")."""
    import numpy as np

    from coclr.learn import scores

    (tmp_path / "embeddings" / "rgb").mkdir(parents=True)

    class Embedded:
        def __init__(self, folder):
            self.videos = np.eye(3, dtype=np.float32)

        def row_of(self, path):
            return {"a.mp4": 0, "b.mp4": 1}.get(path)

    monkeypatch.setattr(scores, "Embeddings", Embedded)
    labels = {"file": "l.csv", "classes": ["x", "y"], "videos": {"a.mp4": (0, "train"), "broken.mp4": (1, "train")}}
    result = scores.label_scores(tmp_path, labels)
    assert result["embeddings"] == {} and result["videos"] == 1 and result["labelled"] == 2
    assert any("1 labelled video(s) have no vector" in note and "broken.mp4" in note for note in result["notes"])
    assert any(note.startswith("nothing scored: 1 labelled video(s) have a vector") for note in result["notes"])
    labels["videos"]["b.mp4"] = (1, "test")
    result = scores.label_scores(tmp_path, labels)
    assert set(result["embeddings"]) == {"rgb"} and result["videos"] == 2
    assert [note for note in result["notes"] if "nothing scored" in note] == []


def test_measures_of_more_neighbours_than_the_gallery_holds_are_left_out(tmp_path, monkeypatch):
    """Five labelled videos showed R@5 and R@10 of 100 (every query's whole gallery of four): a figure of the labels,
    not of the features, shown as a result."""
    import numpy as np

    from coclr.learn import scores

    features = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    labels = np.array([0, 0, 1, 1, 2])
    loo = scores.scores_of(features, labels, ["train"] * 5)
    assert loo["gallery"] == 4 and loo["R@1"] is not None and loo["R@5"] is None and loo["R@10"] is None
    assert loo["kNN@5"] is None and "R@5, R@10, kNN@5 not measured: the gallery holds 4" in loo["unmeasured"]
    split = scores.scores_of(features, labels, ["train", "test", "train", "test", "train"])
    assert split["gallery"] == 3 and split["R@1"] is not None and split["R@5"] is None
    wide = scores.scores_of(np.tile(features, (3, 1)), np.tile(labels, 3), ["train"] * 15)
    assert wide["R@10"] is not None and wide["kNN@5"] is not None and "unmeasured" not in wide
    (tmp_path / "embeddings" / "rgb").mkdir(parents=True)

    class Embedded:
        def __init__(self, folder):
            self.videos = features

        def row_of(self, path):
            return int(path[0])

    monkeypatch.setattr(scores, "Embeddings", Embedded)
    result = scores.label_scores(tmp_path, {"file": "l.csv", "videos": {f"{i}.mp4": (int(labels[i]), "train")
                                                                     for i in range(5)}})
    assert any(note.startswith("R@5, R@10, kNN@5 not measured") for note in result["notes"])


def test_chance_is_that_of_the_scored_videos():
    """Chance was one over the labels file's classes, counting classes no scored video has (20% for five classes
    where the seven scored videos held four, whose R@1 at random is 25%)."""
    import numpy as np

    from coclr.learn.scores import chance_recall

    labels = np.array([0, 0, 1, 2, 0, 1, 2, 3])
    splits = ["train"] * 4 + ["test"] * 4  # queries of classes 0, 1, 2 and 3 against a gallery of 0, 0, 1, 2
    # (the class-3 query has nothing to find: left out of the scores, and of chance)
    assert chance_recall(labels, splits) == pytest.approx(100 * (2 / 4 + 1 / 4 + 1 / 4) / 3)
    assert chance_recall(np.array([0, 0, 1]), ["train"] * 3) == pytest.approx(100 * (1 / 2 + 1 / 2) / 2)
    assert chance_recall(np.array([0, 1, 2]), ["train"] * 3) == 0.0


def test_a_query_with_nothing_of_its_class_to_find_is_left_out_and_none_is_nothing_measured():
    """Eight clips of eight actions scored R@1 0.0, R@5 0.0, kNN 0.0 (chance 0.0) as if measured: no query had a
    video of its class to find."""
    import numpy as np

    from coclr.learn.scores import scores_of

    features = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    alone = scores_of(features, np.arange(8), ["train"] * 8)
    assert alone["queries"] == 0 and all(alone[key] is None for key in ("R@1", "R@5", "kNN@5"))
    assert alone["unmeasured"].startswith("nothing measured: no labelled video has another of its class")
    some = scores_of(features, np.array([0, 0, 0, 1, 1, 1, 2, 3]), ["train"] * 8)
    assert some["queries"] == 6 and some["R@1"] is not None
    assert some["left_out"].startswith("2 labelled video(s) whose class no video of their gallery has")
    split = scores_of(features, np.array([0, 0, 1, 1, 0, 1, 2, 2]), ["train"] * 4 + ["test"] * 4)
    assert split["queries"] == 2 and "2 labelled video(s)" in split["left_out"]  # (class 2: no train video)


def test_the_report_says_the_epochs_the_stages_trained():
    """The report said "two CoCLR cycles of 22 epochs per view (1408 steps)" where the stages, sized as they started,
    trained 33, 32, 37 and 61."""
    from coclr.learn.report import _coclr_epochs

    plan = {"epochs": {"infonce": 10, "coclr": 22}, "steps": 2 * (2 * 10 + 4 * 22)}  # 2 steps an epoch
    assert _coclr_epochs(plan) == f"of 22 epochs per view ({plan['steps']} steps)"
    plan["stage_epochs"] = {"cycle1_rgb": 33, "cycle1_flow": 32, "cycle2_rgb": 37, "cycle2_flow": 61}
    said = _coclr_epochs(plan)
    assert "cycle1_rgb 33, cycle1_flow 32, cycle2_rgb 37, cycle2_flow 61 epochs; 22 planned" in said
    assert said.endswith(f"{2 * (20 + 33 + 32 + 37 + 61)} steps in all")
    # the exported encoder's model card says the same steps (it said the planned ones)
    from coclr.learn.stages import card_notes

    notes = card_notes({"plan": {**plan, "batch": 12, "model": {"width": 0.125}}, "videos": 8}, None)
    assert f"{2 * (20 + 33 + 32 + 37 + 61)} steps of batch 12" in notes[0] and " on 8 videos " in notes[0]
    failed = [{"path": "/v/bad.mp4", "error": "DataError: cannot decode"}]  # (said "on 9 videos": learnt from 8)
    notes = card_notes({"plan": {**plan, "batch": 12, "model": {"width": 0.125}}, "videos": 9, "failed": failed}, None)
    assert " on 8 of its 9 videos " in notes[0]
    notes = card_notes({"plan": {**plan, "batch": 12, "model": {"width": 0.125}}, "videos": 9, "failed": failed,
                        "trained_videos": 9}, None)  # (it failed to embed only: trained on all the same)
    assert " on 9 videos " in notes[0]
    init = {"rgb": {"source": "/runs/old/encoder_rgb.pth", "format": "ours", "sha256": "ab" * 32}}
    notes = card_notes({"plan": {**plan, "batch": 12, "model": {"width": 0.125}, "init": init}, "videos": 8}, None)
    assert "its rgb encoder started from /runs/old/encoder_rgb.pth (ours checkpoint, sha256 abababababab...)" in \
        notes  # (a warm start's card never said what it started from)


def test_a_phase_killed_outright_keeps_its_seconds_to_the_last_record(tmp_path):
    """kill -9 in a phase: learn.json's clock had the part's seconds, but the phase's share was added only as the
    phase ended, so the report's table left out every killed part (InfoNCE "took 81 s" of 136)."""
    import json
    import time

    from coclr.learn.run import RESULT_FILE, Clock, timed

    result = {"phases": {"infonce": 5.0}}
    clock = Clock(tmp_path, 20.0, time.perf_counter())
    with timed(clock, result, "infonce"):
        time.sleep(0.05)
        clock.record(result)  # a tick; then the process is killed: what the file holds is what is kept
        recorded = json.loads((tmp_path / RESULT_FILE).read_text())
    assert 5.05 <= recorded["phases"]["infonce"] < 6.0 and recorded["seconds"] >= 20.05
    assert 5.05 <= result["phases"]["infonce"] and "infonce" in result["phases_done"]
    assert clock.running is None


def test_a_resumed_phase_s_earlier_work_is_not_taken_for_this_part_s_pace(monkeypatch):
    """After kill -9, the side-by-side scheduler reported the epochs the earlier part had trained as this part's:
    "about 02:24 left" of an 8-minute plan, then the time left climbing 3.5 s a second."""
    from coclr.learn import line as module
    from coclr.learn.line import ProgressLine
    from coclr.progress import bar, observed

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    with ProgressLine({"measure": 10.0, "infonce": 100.0}, enabled=False, done=("measure",)) as line, \
            observed(line.observe), line.phase("infonce", 10):
        with bar(total=10, initial=4, desc="infonce") as progress:  # 4 of 10 epochs found done
            now[0] += 12.0
            progress.update(1)  # one more epoch in 12 s: 10 estimated, so the pace is 1.2
            assert line.eta() == pytest.approx(50.0 * 1.2)  # the 5 left at this part's pace
    with ProgressLine({"infonce": 100.0}, enabled=False) as line, observed(line.observe), line.phase("infonce", 10):
        with bar(total=10, desc="infonce") as progress:  # the same work from the start: the same pace
            progress.update(4)
            now[0] += 48.0
            progress.update(1)
            assert line.eta() == pytest.approx(50.0 * 48.0 / 50.0)  # all 5 done in its 48 s



def test_the_measuring_line_counts_down_and_is_drawn_while_nothing_reports(monkeypatch):
    """The measuring line's clock stood at "00:00 so far" for 13 s while videos decoded, and its time left stood
    still between predictions."""
    from coclr.learn import line as module
    from coclr.learn.line import MeasureLine

    now = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    with MeasureLine(3, enabled=False) as measure:
        assert measure.remaining() is None
        measure.measuring("training steps", 40.0)
        now[0] += 15.0
        assert measure.remaining() == pytest.approx(25.0)
        now[0] += 60.0
        assert measure.remaining() == 0.0
    drawn = []
    monkeypatch.setattr(module, "REDRAW_SECONDS", 0.01)
    monkeypatch.setattr(MeasureLine, "_show", lambda self: drawn.append(1))
    with MeasureLine(3, enabled=True):
        deadline = time.perf_counter() + 5
        while len(drawn) < 5 and time.perf_counter() < deadline:
            time.sleep(0.01)
    assert len(drawn) >= 5


def test_a_refused_learn_folder_names_the_budget_as_typed():
    """"holds a learn run with budget=480.0 (given 540.0)": seconds, where the user typed --budget 8m."""
    from coclr.learn.options import budget_text, parse_budget
    from coclr.learn.run import LEARN_FOLDER

    assert LEARN_FOLDER.differing({"budget": 480.0, "seed": 0}, {"budget": 540.0, "seed": 0}) == [
        "budget='8m' (given '9m')"]
    assert LEARN_FOLDER.differing({"budget": 480.0}, {"budget": 480.5}) == ["budget='8m' (given '480.5s')"]
    for seconds in (90.0, 480.0, 7200.0, 0.25):
        assert parse_budget(budget_text(seconds)) == seconds


def test_the_agreement_of_a_collapsed_stage_is_marked():
    """docs/learn.md says a collapsed stage's output is marked wherever it appears; the agreement table showed
    "cycle2_rgb + cycle2_flow 0.0" unmarked where cycle2_flow had collapsed."""
    from coclr.learn.report import COLLAPSED_MARK, _stages

    measures = {"effective_rank": 1.0, "alignment": 0.0, "uniformity": 0.0}
    result = {"stages": {"cycle2_rgb": {"view": "rgb", "method": "coclr", **measures},
                         "cycle2_flow": {"view": "flow", "method": "coclr", **measures}},
              "agreement": {"cycle2": {"stages": ["cycle2_rgb", "cycle2_flow"], "nearest_neighbour": 0.0,
                                       "chance": 12.5}}}
    page = _stages(result, {"cycle2_flow"}, {})
    row = page[page.index("<td>cycle2</td>"):]
    assert f'cycle2_rgb + cycle2_flow <span class="mark">{COLLAPSED_MARK}</span>' in row


def test_a_video_changed_since_the_run_learnt_from_it_is_refused_with_every_other_option(tmp_path):
    """A finished run whose video was replaced by other content said "finished before; nothing to do" and kept the
    embeddings of the old content; other videos were refused without the other options that differ (the corrected
    command was then refused for those)."""
    import os

    from coclr.learn.run import INPUTS_FILE, LEARN_FOLDER, check_inputs, write_inputs_record
    from coclr.runfolder import claim_folder

    videos = [tmp_path / f"v{number}.mp4" for number in range(3)]
    for number, video in enumerate(videos):
        video.write_bytes(bytes([number]) * 100)
    paths = [str(video) for video in videos]
    options = {"videos": {"count": 3, "sha256": "ab"}, "budget": 300.0, "seed": 0, "labels": None, "device": None,
               "workers": None}
    out = tmp_path / "run"
    with claim_folder(out, LEARN_FOLDER, options):
        write_inputs_record(out, paths)
    check_inputs(out, paths, False, options)  # the same: continued
    assert json.loads((out / INPUTS_FILE).read_text())["videos"] == paths
    # touched (or copied without its times), its content the one its store entry noted: the same video, as the
    # store's rule has it (coclr.store.build.changed_videos)
    from coclr.atomic import file_sha256
    from coclr.store.clipstore import create_store, record_notes
    from coclr.video.indexes import VideoEntry, VideoIndex

    create_store(out / "store", VideoIndex("v", ["a"], [VideoEntry(video.name, 0, "train") for video in videos]))
    record_notes(out / "store", "rgb", ["v0.mp4"], {"v0.mp4": {"source": [100, 1], "sha256": file_sha256(videos[0])}})
    os.utime(videos[0], ns=(1, 1))
    check_inputs(out, paths, False, options)
    videos[1].write_bytes(b"other content, same name")
    with pytest.raises(ConfigError, match=r"learnt from other videos: 1 changed since \(.*v1.mp4\): its encoders and "
                                          r"embeddings are of their earlier content; give the same videos, restored, "
                                          r"to continue it, another --out, or --restart"):
        check_inputs(out, paths, False, options)
    check_inputs(out, paths, True, options)  # --restart: moved aside, so nothing to refuse here
    with pytest.raises(ConfigError, match=r"1 removed \(.*v2.mp4\); 1 changed since \(.*v1.mp4\): .*; and other "
                                          r"options: budget='5m' \(given '10m'\); give the same videos, restored, "
                                          r"and options to continue it"):  # (each difference at once)
        check_inputs(out, paths[:2], False, {**options, "budget": 600.0})
