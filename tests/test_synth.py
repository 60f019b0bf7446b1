"""The synthetic dataset: options, layout of the index, determinism, the store job, and the property the
demo needs (motion tells the classes apart across scenes, appearance does not)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from coclr.config import load_config
from coclr.errors import ConfigError, DataError
from coclr.store.clipstore import ClipStore, entry_path
from coclr.store.jpeg import encode_jpeg
from coclr.synth import (
    ACTORS,
    MOTIONS,
    SynthConfig,
    actor_colours,
    dataset_clips,
    generate_synthetic,
    parse_key,
    render_clip,
    scene_style,
    synthetic_index,
    write_videos,
)
from coclr.synth.render import group_objects, shape_sdf
from synth_diagnostics import appearance_features, clip_flow, motion_features, nearest_neighbour_accuracy

REPO_ROOT = Path(__file__).resolve().parents[1]

TINY = dict(num_classes=4, train_scenes=2, test_scenes=1, actions_per_scene=4, clips_per_action=2,
            frames=6, height=24, width=24)


def tiny(**changes) -> SynthConfig:
    return load_config(SynthConfig, base={**TINY, **changes})


def entry_bytes(root: Path, view: str = "rgb") -> dict[str, bytes]:
    store = ClipStore(root)
    return {key: entry_path(root, key, view).read_bytes() for key in store.keys()}


# ------------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize("override, key", [
    ("num_classes=1", "num_classes"),
    (f"num_classes={len(MOTIONS) + 1}", "num_classes"),
    ("actions_per_scene=9", "actions_per_scene"),
    ("test_scenes=1", "test_scenes"),  # 1 scene x 4 actions cannot show 8 classes
    ("frames=1", "frames"),
    ("frames=100000000", "frames: 100000000 frames of 32 x 32 px are more than a clip"),  # (a MemoryError, minutes on)
    ("objects_min=4", "objects_min"),
    ("size_max=0.4", "size_max"),
    ("speed_min=0", "speed_min"),
    ("seed=-1", "seed"),
    ("actor_cue=1.5", "actor_cue"),
    ("motions=[circle, jump]", "motions"),
    ("motions=[circle, circle]", "motions"),
    ("motions=[circle, rotate]", "num_classes"),  # 2 names, num_classes 8
])
def test_bad_options_are_rejected_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(SynthConfig, overrides=[override])


def test_malformed_keys_are_rejected():
    with pytest.raises(ConfigError, match="scene1/zoom_in"):
        parse_key("scene1/zoom_in/c01")
    with pytest.raises(ConfigError, match="rotate"):
        render_clip(tiny(), "scene0000/rotate/c01")  # not among the first 4 classes


# ------------------------------------------------------------------------------------------------- layout


def test_motions_choose_the_classes_and_their_order():
    chosen = ["circle", "translate_up", "still"]
    config = tiny(num_classes=3, motions=chosen, actions_per_scene=3)
    index = synthetic_index(config)
    assert index.classes == chosen
    assert {parse_key(e.path)[1] for e in index.entries} == set(chosen)
    assert all(index.classes[e.label] == parse_key(e.path)[1] for e in index.entries)
    # A class is drawn the same wherever it sits in the list: as label 0 here, label 8 by default.
    key = next(e.path for e in index.entries if e.label == 0)
    default = tiny(num_classes=len(MOTIONS), train_scenes=3, test_scenes=3)
    assert np.array_equal(render_clip(config, key), render_clip(default, key))
    with pytest.raises(ConfigError, match="rotate"):
        render_clip(config, key.replace("circle", "rotate"))  # not among the chosen


def test_stores_record_motions_only_when_given(tmp_path):
    generate_synthetic(tmp_path / "a", tiny(), workers=1)
    assert "motions" not in ClipStore(tmp_path / "a").meta["synth"]  # as stores from before the option
    chosen = tiny(num_classes=2, motions=["still", "circle"], actions_per_scene=2)
    generate_synthetic(tmp_path / "b", chosen, workers=1)
    assert ClipStore(tmp_path / "b").meta["synth"]["motions"] == ["still", "circle"]
    generate_synthetic(tmp_path / "b", chosen, workers=1)  # resumes
    with pytest.raises(DataError, match=r"motions=\['still', 'circle'\] \(given null\)"):
        generate_synthetic(tmp_path / "b", tiny(num_classes=2, actions_per_scene=2), workers=1)


def test_index_layout_classes_groups_splits():
    config = load_config(SynthConfig, base=dict(num_classes=6, train_scenes=7, test_scenes=3,
                                                actions_per_scene=4, clips_per_action=3))
    index = synthetic_index(config)
    assert index.classes == list(MOTIONS[:6])
    assert len(index) == (7 + 3) * 4 * 3

    scenes_of = defaultdict(set)
    labels_of_scene = defaultdict(set)
    members = defaultdict(list)
    for entry in index.entries:
        scene, motion, clip = parse_key(entry.path)
        assert index.classes[entry.label] == motion
        assert entry.group == f"{scene}_{motion}"
        scenes_of[entry.split].add(scene)
        labels_of_scene[scene].add(entry.label)
        members[entry.group].append(clip)
    assert scenes_of["train"].isdisjoint(scenes_of["test"])
    assert len(scenes_of["train"]) == 7 and len(scenes_of["test"]) == 3
    assert all(len(labels) == 4 for labels in labels_of_scene.values())  # distinct actions per scene
    assert all(sorted(clips) == [1, 2, 3] for clips in members.values())
    for split, scenes in (("train", 7), ("test", 3)):
        counts = Counter(e.label for e in index.entries if e.split == split)
        assert set(counts) == set(range(6))  # every class in both splits
        per_class = sorted(counts.values())
        assert per_class[-1] - per_class[0] <= 3  # balanced: at most one scene (3 clips) apart
        assert sum(per_class) == scenes * 4 * 3


def test_scene_actions_vary_between_scenes():
    config = load_config(SynthConfig, base=dict(train_scenes=24, actions_per_scene=4))
    combos = defaultdict(set)
    for clip in dataset_clips(config):
        if clip.split == "train":
            combos[parse_key(clip.key)[0]].add(clip.label)
    assert len({frozenset(c) for c in combos.values()}) > 4


# --------------------------------------------------------------------------------------------- rendering


def test_render_is_a_pure_function_of_seed_and_key():
    config = tiny()
    keys = [c.key for c in dataset_clips(config)]
    first = render_clip(config, keys[3])
    assert first.dtype == np.uint8 and first.shape == (6, 24, 24, 3)
    for key in reversed(keys):  # rendering others in between changes nothing
        render_clip(config, key)
    np.testing.assert_array_equal(render_clip(config, keys[3]), first)
    assert not np.array_equal(render_clip(tiny(seed=1), keys[3]), first)
    assert not np.array_equal(render_clip(config, keys[4]), first)


def test_clips_of_a_group_are_consecutive_segments_of_one_video():
    """c01 and c02 of a group with F frames are frames [0, F) and [F, 2F) of the group's source video,
    i.e. the one clip of a 2F-frame dataset (noise off: noise is drawn per clip)."""
    key1, key2 = "scene0001/zoom_in/c01", "scene0001/zoom_in/c02"
    short = tiny(noise=0.0, num_classes=8, train_scenes=2, test_scenes=2)
    long = tiny(noise=0.0, num_classes=8, train_scenes=2, test_scenes=2, frames=12, clips_per_action=1)
    joined = np.concatenate([render_clip(short, key1), render_clip(short, key2)])
    difference = np.abs(joined.astype(int) - render_clip(long, key1).astype(int))
    assert difference.max() <= 1  # identical up to floating-point rounding


def test_single_frames_do_not_depend_on_the_class_scene_does():
    """Within one scene, first frames of different classes are about as different as first frames of two
    groups of one class would be, and much closer than frames of other scenes (the scene sets appearance)."""
    config = load_config(SynthConfig, base=dict(frames=2, train_scenes=24, noise=0.0))
    clips = [c for c in dataset_clips(config) if c.key.endswith("c01") and c.split == "train"]
    features = np.stack([appearance_features(render_clip(config, c.key)) for c in clips])
    scenes = np.array([parse_key(c.key)[0] for c in clips])
    distances = ((features[:, None] - features[None]) ** 2).sum(-1)
    np.fill_diagonal(distances, np.inf)
    nearest = distances.argmin(axis=1)
    same_scene = (scenes[nearest] == scenes).mean()
    assert same_scene > 0.8, same_scene


def test_actor_cue_gives_objects_the_class_actor_with_its_probability():
    """actor_cue=0 keeps every scene's objects, 1 makes every object its class's actor (shape and colours),
    0.5 about half (draws per group: both clips of a video show the same objects); pattern and size stay."""
    def objects(cue):
        config = load_config(SynthConfig, base=dict(actor_cue=cue))
        found = []
        for clip in dataset_clips(config):
            scene, motion, _ = parse_key(clip.key)
            style = scene_style(config, scene)
            for obj, own in zip(group_objects(config, style, scene, motion), style.objects):
                assert (obj.pattern, obj.radius, obj.pattern_phase) == (own.pattern, own.radius, own.pattern_phase)
                is_actor = obj.shape == ACTORS[motion] and np.array_equal(obj.colours, actor_colours(motion))
                is_own = obj.shape == own.shape and np.array_equal(obj.colours, own.colours)
                assert is_actor or is_own
                found.append((is_actor, is_own))
        return found

    assert all(is_own and not is_actor for is_actor, is_own in objects(0.0))
    assert all(is_actor for is_actor, _ in objects(1.0))
    half = objects(0.5)
    share = np.mean([is_actor for is_actor, is_own in half if is_actor != is_own])
    assert 0.35 < share < 0.65, share


def test_actor_colours_are_a_bright_and_a_dark_shade_of_one_hue_per_class():
    """Each class's actor has its own hue (evenly spaced, so no two classes share colours), in a bright and
    a dark shade, checked against colorsys."""
    import colorsys

    hues = []
    for index, motion in enumerate(MOTIONS):
        bright, dark = actor_colours(motion)
        np.testing.assert_allclose(dark, bright * 0.45 / 0.95, atol=1e-12)
        hue, saturation, value = colorsys.rgb_to_hsv(*bright)
        assert saturation == pytest.approx(1.0) and value == pytest.approx(0.95)
        assert hue == pytest.approx(index / len(MOTIONS), abs=1e-9)
        hues.append(hue)
    assert len(set(np.round(hues, 6))) == len(MOTIONS)


def test_actor_cue_changes_only_the_objects_of_a_clip():
    """With the cue, a clip differs from the cue-free clip in part of the frame (the objects), not
    everywhere: the background and the motion are the same draws."""
    key = "scene0001/zoom_out/c01"  # zoom_out's actor is the dome, a shape no scene draws
    plain = render_clip(tiny(noise=0.0, num_classes=8, train_scenes=2, test_scenes=2), key)
    cued = render_clip(tiny(noise=0.0, num_classes=8, train_scenes=2, test_scenes=2, actor_cue=1.0), key)
    changed = np.abs(plain.astype(int) - cued.astype(int)).max(axis=-1) > 8
    assert 0.01 < changed.mean() < 0.5, changed.mean()


def test_dome_outline():
    """The dome (zoom_out's actor): the part of a unit disc about (0, -0.4) where v > 0."""
    u, v = np.meshgrid(np.linspace(-1.5, 1.5, 61), np.linspace(-1.5, 1.5, 61))
    inside = shape_sdf("dome", u, v) < 0
    expected = (np.hypot(u, v + 0.4) < 1.0) & (v > 0)
    assert (inside != expected).mean() < 0.01


# ------------------------------------------------------------------------------------------------- store


def test_generate_store_is_deterministic_resumable_and_worker_independent(tmp_path):
    config = tiny()
    summary = generate_synthetic(tmp_path / "a", config, workers=1)
    assert summary.ok and summary.job.done == len(dataset_clips(config)) == summary.train + summary.test
    assert "4 motion classes" in str(summary) and "16 train clips" in str(summary)
    generate_synthetic(tmp_path / "b", config, workers=2)
    first = entry_bytes(tmp_path / "a")
    assert first == entry_bytes(tmp_path / "b")

    store = ClipStore(tmp_path / "a")
    key = store.keys()[5]
    rendered = render_clip(config, key)
    assert store.read_encoded(key, "rgb", range(6)) == [encode_jpeg(f, config.jpeg_quality) for f in rendered]
    assert store.fps(key, "rgb") == config.fps
    assert store.entry(key).group == "_".join(parse_key(key)[:2])
    assert store.index.to_dict() == synthetic_index(config).to_dict()

    entry_path(tmp_path / "a", key, "rgb").unlink()  # as if killed before this entry
    resumed = generate_synthetic(tmp_path / "a", config, workers=1)
    assert (resumed.job.done, resumed.job.skipped) == (1, len(first) - 1)
    assert entry_bytes(tmp_path / "a") == first

    generate_synthetic(tmp_path / "c", tiny(seed=5), workers=1)
    other = entry_bytes(tmp_path / "c")
    assert other.keys() != first.keys() or all(other[k] != first[k] for k in first)


def test_resuming_with_other_options_names_them(tmp_path):
    generate_synthetic(tmp_path, tiny(), workers=1)
    with pytest.raises(DataError, match=r"frames=6 \(given 7\)"):
        generate_synthetic(tmp_path, tiny(frames=7), workers=1)


def test_another_job_writing_the_store_is_refused_before_any_write(tmp_path):
    from coclr.store.jobs import view_lock

    out = tmp_path / "synth"
    out.mkdir()
    held, release = threading.Event(), threading.Event()

    def other_job() -> None:  # another thread: the lock is re-entrant only within one thread
        with view_lock(out, "rgb", "the other job"):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=other_job)
    holder.start()
    try:
        held.wait(60)
        with pytest.raises(DataError, match="being written by another job \\(the other job\\)"):
            generate_synthetic(out, tiny(), workers=1)
    finally:
        release.set()
        holder.join()
    assert sorted(p.name for p in out.iterdir()) == [".lock_rgb"]  # no index, no metadata, no frames
    assert generate_synthetic(out, tiny(), workers=1).job.done == len(dataset_clips(tiny()))


def test_cli_generates_a_store(tmp_path):
    out = tmp_path / "synth"
    overrides = [f"{k}={v}" for k, v in TINY.items()]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    result = subprocess.run([sys.executable, "-m", "coclr", "data", "synth", "--out", str(out), "--seed", "1",
                             "--workers", "1", *overrides], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "synthetic dataset" in result.stdout and "0 failed" in result.stdout
    store = ClipStore(out)
    assert store.meta["synth"]["seed"] == 1
    key = store.keys()[0]
    assert store.read(key, "rgb", [0, 5]).shape == (2, 24, 24, 3)


def test_write_videos_round_trip(tmp_path):
    from coclr.runfolder import FolderRefused
    from coclr.synth.output import video_name
    from coclr.video.decode import decode_video
    from coclr.video.indexes import csv_index

    config = tiny(test_scenes=1, train_scenes=1, frames=8, height=32, width=32)
    manifest = write_videos(tmp_path, config)
    assert manifest == tmp_path / "labels.csv"
    index = csv_index(manifest)
    clips = dataset_clips(config)
    assert len(index) == len(clips)
    by_path = {entry.path: entry for entry in index.entries}
    names = sorted(p.name for p in (tmp_path / "videos").iterdir())
    assert names == sorted(video_name(config, clip.key) for clip in clips)
    for clip in clips:
        entry = by_path[f"videos/{video_name(config, clip.key)}"]
        assert entry.split == clip.split and entry.group == clip.group
        assert index.classes[entry.label] == config.classes[clip.label]
        assert not any(word in entry.path for word in (*config.classes, "scene", clip.split))  # names tell nothing
    decoded = decode_video(tmp_path / f"videos/{video_name(config, clips[0].key)}")
    rendered = render_clip(config, clips[0].key)
    assert decoded.shape == rendered.shape
    assert np.abs(decoded.astype(int) - rendered.astype(int)).mean() < 8  # H.264 at CRF 18, 4:2:0 chroma
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "videos").iterdir()}
    assert write_videos(tmp_path, config) == manifest  # the same options continue: nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "videos").iterdir()} == before
    with pytest.raises(FolderRefused, match="seed=0 \\(given 1\\)"):
        write_videos(tmp_path, tiny(test_scenes=1, train_scenes=1, frames=8, height=32, width=32, seed=1))
    with pytest.raises(ConfigError, match="even"):
        write_videos(tmp_path / "odd", tiny(width=25))


# -------------------------------------------------------------------------- the problem the demo poses


def test_motion_tells_classes_apart_across_scenes_appearance_does_not():
    """Nearest neighbour from train scenes to unseen test scenes: appearance features stay near chance,
    flow-based motion features are far above it (measured on this config: about 0.14 and 0.8)."""
    import cv2

    cv2.setNumThreads(1)
    config = load_config(SynthConfig, base=dict(train_scenes=16, test_scenes=8, clips_per_action=1,
                                                 frames=12))
    clips = dataset_clips(config)
    labels = np.array([c.label for c in clips])
    train = np.array([c.split == "train" for c in clips])
    appearance, motion = [], []
    for clip in clips:
        frames = render_clip(config, clip.key)
        appearance.append(appearance_features(frames))
        motion.append(motion_features(clip_flow(frames)))
    appearance, motion = np.stack(appearance), np.stack(motion)
    chance = 1 / config.num_classes
    appearance_accuracy = nearest_neighbour_accuracy(appearance[train], labels[train], appearance[~train],
                                                     labels[~train])
    motion_accuracy = nearest_neighbour_accuracy(motion[train], labels[train], motion[~train], labels[~train])
    assert appearance_accuracy < chance + 0.15, appearance_accuracy
    assert motion_accuracy > 4 * chance, motion_accuracy


def test_seed_from_an_override_or_a_config_file_is_honoured_and_a_conflict_refused(tmp_path, capsys):
    """`data synth seed=5` and a config file's `seed: 7` were silently replaced by seed 0 (only --seed worked)."""
    from coclr.cli import main
    from coclr.cli._synth import synth_config

    config_file = tmp_path / "synth.yaml"
    config_file.write_text("seed: 7\n")
    assert synth_config(None, ["seed=5"], None).seed == 5
    assert synth_config(str(config_file), [], None).seed == 7
    assert synth_config(str(config_file), ["seed=5"], None).seed == 5
    assert synth_config(None, [], 3).seed == 3
    assert synth_config(None, [], None).seed == 0
    assert synth_config(str(config_file), [], 7).seed == 7
    with pytest.raises(ConfigError, match="--seed 3 disagrees with seed 5 from the seed=N override"):
        synth_config(None, ["seed=5"], 3)
    with pytest.raises(ConfigError, match="seed 7 from the config file"):
        synth_config(str(config_file), [], 3)
    out = tmp_path / "store"
    assert main(["data", "synth", "--out", str(out), "--seed", "3", "seed=5"]) == 2
    assert "disagrees" in capsys.readouterr().err and not out.exists()  # refused before any work
    assert main(["data", "synth", "--videos", str(out), "--workers", "4"]) == 2  # it had no effect, silently
    assert "--workers: applies to --out (the clip store)" in capsys.readouterr().err and not out.exists()


def test_a_refused_output_folder_names_data_synth_and_the_folder_s_own_command(tmp_path, capsys, monkeypatch):
    """`data synth --out` on a folder of `data synth --videos` (or of other files) said "which coclr data store did
    not write": the store's rule named the command that builds stores from videos."""
    from coclr.cli import main
    from coclr.runfolder import RUN_RECORD

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vq").mkdir()
    (tmp_path / "vq" / "labels.csv").write_text("path,label\n")
    (tmp_path / "vq" / RUN_RECORD).write_text('{"command": "data synth --videos", "options": {}}')
    assert main(["data", "synth", "--out", "vq", "frames=8"]) == 2
    assert "error: vq: the output folder of `coclr data synth --videos`, not of `coclr data synth`; give another " \
        "folder" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("mine")
    assert main(["data", "synth", "--out", "other", "frames=8"]) == 2
    assert "other: holds x.txt, which coclr data synth did not write" in capsys.readouterr().err


def test_a_study_makes_its_synthetic_store_inside_its_folder(tmp_path):
    """The synthetic store's writer named as `data synth` (not `data store`) was refused inside the study's own
    folder: the default `coclr study` and `coclr demo` stopped at their first step."""
    from coclr.config import from_dict
    from coclr.runfolder import claim_folder
    from coclr.study.run import STUDY_FOLDER
    from coclr.synth import SynthConfig, generate_synthetic

    config = from_dict(SynthConfig, {"train_scenes": 1, "test_scenes": 1, "num_classes": 2, "actions_per_scene": 2,
                                     "clips_per_action": 1, "frames": 8, "height": 32, "width": 32})
    with claim_folder(tmp_path / "study", STUDY_FOLDER, {"seed": 0}):
        generate_synthetic(tmp_path / "study" / "store", config, workers=0)
    assert (tmp_path / "study" / "store" / "store.json").is_file()


def test_a_run_into_a_store_folder_names_the_store_not_its_files(tmp_path, capsys):
    """A refusal of a store as another command's output named its files and said to move them away (which would
    break the store), where it named the store; a synthetic store's writer is a store's writer."""
    from coclr.cli import main

    store = tmp_path / "rs2"
    assert main(["data", "synth", "--out", str(store), "frames=8", "--workers", "0"]) == 0
    capsys.readouterr()
    assert main(["pretrain", f"data.store={store}", f"run.out={store}"]) == 2
    assert f"error: {store}: the output folder of `coclr data store`, not of `coclr pretrain`; give another folder" \
        in capsys.readouterr().err
    assert main(["data", "synth", "--out", str(store), "frames=8", "--workers", "0"]) == 0  # its own: continued
