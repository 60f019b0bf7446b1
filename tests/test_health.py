"""The collapse test (coclr.eval.health) and its marks: features that carry nothing of the class are degenerate
even when they spread (CoCLR K=1 at effective rank 1.25, issue 40), and every output marks such a row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from coclr.eval.health import (
    CHANCE_MARGIN_SD,
    MIN_EFFECTIVE_RANK,
    MIN_RELATIVE_VARIANCE,
    chance_nn_accuracy,
    feature_health,
    nn_accuracy,
)
from test_eval_helpers import make_tiny_store, save_tiny_encoder


def reference_nn_accuracy(features: np.ndarray, labels: np.ndarray, groups=None) -> float:
    """One video at a time: centre, normalise, its most similar videos of other groups (ties share the hit)."""
    groups = [f"own{i}" for i in range(len(labels))] if groups is None else groups
    x = features.astype(np.float64) - features.astype(np.float64).mean(axis=0)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    total = 0.0
    for i in range(len(x)):
        others = [j for j in range(len(x)) if j != i and (groups[j] is None or groups[j] != groups[i])]
        scores = np.array([float(x[i] @ x[j]) for j in others])
        best = [others[n] for n in np.flatnonzero(scores == scores.max())]
        total += sum(labels[j] == labels[i] for j in best) / len(best)
    return total / len(x)


def reference_chance(labels: np.ndarray, groups=None) -> float:
    """The share of a video's class among the videos of other groups, averaged, counted pair by pair."""
    groups = [f"own{i}" for i in range(len(labels))] if groups is None else groups
    shares = []
    for i in range(len(labels)):
        others = [j for j in range(len(labels)) if j != i and (groups[j] is None or groups[j] != groups[i])]
        shares.append(sum(labels[j] == labels[i] for j in others) / len(others))
    return sum(shares) / len(shares)


def spread_without_class(videos: int = 384, classes: int = 8, seed: int = 0):
    """Features like the K=1 row of issue 40: they spread (effective rank about 1.25), along directions that have
    nothing to do with the class; and labels of balanced classes."""
    rng = np.random.default_rng(seed)
    labels = np.arange(videos) % classes
    features = rng.normal(size=(videos, 16)) * np.array([1.0, 0.2] + [0.01] * 14)
    return features, labels


def test_nn_accuracy_matches_a_video_by_video_reference_whatever_the_chunk() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, size=37)
    features = rng.normal(size=(37, 5)) + 2.0 * np.eye(4, 5)[labels]
    features[5] = features[9]  # ties: a duplicated video
    features[20:23] = features[20]
    expected = reference_nn_accuracy(features, labels)
    for chunk in (1, 7, 1024):
        assert nn_accuracy(features, labels, chunk=chunk) == pytest.approx(expected, abs=1e-12)
    assert chance_nn_accuracy(labels) == pytest.approx(reference_chance(labels))
    groups = [None if i % 5 == 0 else f"g{i % 9}" for i in range(37)]  # some videos of no known group
    expected = reference_nn_accuracy(features, labels, groups)
    for chunk in (1, 7, 1024):
        assert nn_accuracy(features, labels, groups, chunk=chunk) == pytest.approx(expected, abs=1e-12)
    assert chance_nn_accuracy(labels, groups) == pytest.approx(reference_chance(labels, groups))


def test_a_video_of_the_same_source_is_not_its_neighbour() -> None:
    """Features that tell only the source video (its scene) apart: each video's nearest is its sibling, of its
    class, but the class is not in them; leaving the group out shows it (UCF101's gXX clips; the built-in data's
    two clips per scene and action)."""
    rng = np.random.default_rng(4)
    labels = np.repeat(rng.integers(0, 8, size=192), 2)  # 192 source videos of two clips each
    groups = [f"g{i // 2}" for i in range(384)]
    features = np.repeat(rng.normal(size=(192, 16)), 2, axis=0) + 0.05 * rng.normal(size=(384, 16))
    assert nn_accuracy(features, labels) == 1.0 and not feature_health(features, labels)["degenerate"]
    health = feature_health(features, labels, groups)
    assert health["nn_accuracy"] < 25 and health["degenerate"]


def test_constant_features_score_chance_not_what_the_order_gives() -> None:
    labels = np.array([0, 0, 0, 1, 1, 2])
    assert nn_accuracy(np.ones((6, 3)), labels) == pytest.approx(chance_nn_accuracy(labels))
    health = feature_health(np.ones((6, 3)), labels)
    assert health["degenerate"] and health["relative_variance"] < MIN_RELATIVE_VARIANCE


def test_features_that_spread_but_carry_no_class_are_degenerate() -> None:
    """The row of issue 40: its spread passes the rank threshold, its nearest neighbours are at chance."""
    features, labels = spread_without_class()
    health = feature_health(features, labels)
    assert MIN_EFFECTIVE_RANK < health["effective_rank"] < 1.5 and health["relative_variance"] > 0.5
    assert health["chance"] == pytest.approx(100 * chance_nn_accuracy(labels))
    margin = CHANCE_MARGIN_SD * 100 * math.sqrt(0.125 * 0.875 / 384)
    assert health["nn_accuracy"] <= health["chance"] + margin and health["degenerate"]
    assert not feature_health(features)["degenerate"]  # without labels only the spread is judged: it passes


def test_features_that_carry_the_class_are_healthy_and_without_labels_the_rank_decides() -> None:
    rng = np.random.default_rng(2)
    labels = np.arange(384) % 8
    clustered = rng.normal(size=(384, 16)) + 3.0 * rng.normal(size=(8, 16))[labels]
    health = feature_health(clustered, labels)
    assert health["nn_accuracy"] > 90 and not health["degenerate"]
    line = np.outer(rng.normal(size=384), rng.normal(size=16)) + 1e-3 * rng.normal(size=(384, 16))
    assert feature_health(line)["effective_rank"] < MIN_EFFECTIVE_RANK and feature_health(line)["degenerate"]
    assert not feature_health(clustered)["degenerate"]


def test_unknown_labels_are_left_out_of_the_nn_test() -> None:
    features, labels = spread_without_class(videos=64)
    unknown = np.full(64, -1)
    assert feature_health(features, unknown)["nn_accuracy"] is None
    mixed = labels.copy()
    mixed[:8] = -1
    assert feature_health(features, mixed)["chance"] == pytest.approx(100 * chance_nn_accuracy(labels[8:]))


# ------------------------------------------------------------------ a collapsed encoder, marked in every output


def collapsed_encoder(path: Path) -> Path:
    """An encoder whose output ignores its input: every conv weight zero (every video gets the same feature)."""
    import torch

    from coclr.models.encoder import Encoder
    from coclr.models.loading import load_encoder, save_encoder

    backbone, head = load_encoder(save_tiny_encoder(path.with_suffix(".init.pt"), seed=5))
    with torch.no_grad():
        for name, parameter in backbone.named_parameters():
            if "conv" in name and name.endswith("weight"):
                parameter.zero_()
    return save_encoder(path, Encoder(backbone, head), {"method": "coclr", "view": "rgb"})


@pytest.fixture(scope="module")
def store_and_encoders(tmp_path_factory):
    """A store of three colour classes (8 train, 7 test videos each: enough for the nearest-neighbour test), a
    random encoder (its features carry the colour: healthy) and a collapsed one."""
    root = tmp_path_factory.mktemp("health")
    store = make_tiny_store(root / "store", train_per_class=8, test_per_class=7, frames=8, views=("rgb", "flow"))
    return store, save_tiny_encoder(root / "healthy.pt", seed=0), collapsed_encoder(root / "collapsed.pt"), root


EVAL_ARGS = ["--length", "8", "--size", "32", "--batch-size", "12", "--quiet"]


def test_coclr_eval_marks_a_collapsed_encoder_and_not_a_healthy_one(store_and_encoders, capsys) -> None:
    from coclr.cli import main

    store, healthy, collapsed, root = store_and_encoders
    for task, extra in (("retrieval", []), ("linear", ["--epochs", "3", "--lrs", "0.01", "--weight-decays", "0"])):
        for checkpoint, expected in ((collapsed, True), (healthy, False)):
            out = root / f"{task}_{checkpoint.stem}.json"
            assert main(["eval", task, "--checkpoint", str(checkpoint), "--store", str(store), "--out", str(out),
                         *EVAL_ARGS, *extra]) == 0
            captured = capsys.readouterr()
            printed = json.loads(captured.out[captured.out.index("{"):])
            record = json.loads(out.read_text())
            assert printed["collapsed"] is expected, (task, record["feature_health"])
            assert bool(record["warnings"]) is expected
            assert ("collapsed encoder" in captured.err) is expected
            if expected:
                assert "effective rank" in record["warnings"][0]
            else:
                assert record["feature_health"][0]["train"]["nn_accuracy"] > 70  # chance: 30.4


def test_every_study_output_marks_a_collapsed_row_and_its_claims(store_and_encoders, tmp_path) -> None:
    """The study's evaluation of four rows whose K=1 encoder collapsed: results.md, table.md, the claims and
    seeds.md mark that row, and only it; the other rows are evaluated as usual."""
    from coclr.config import from_dict, merge
    from coclr.study.config import STUDY_TRAIN, StudyConfig
    from coclr.study.plan import plan_study
    from coclr.study.results import seeds_markdown, summarise_seeds
    from coclr.study.run import evaluate_rows, write_results

    store, healthy, collapsed, _ = store_and_encoders
    rows = ["infonce_rgb", "coclr_rgb", "coclr_k1_rgb", "coclr_k50_rgb"]
    config = from_dict(StudyConfig, {"rows": rows, "columns": ["linear", "retrieval"],
                                     "data": {"source": "store", "store": str(store)},
                                     "train": merge(STUDY_TRAIN, {"run": {"batch_size": 2},  # 24 training videos
                                                                  "method": {"queue_size": 64}}),  # K=50 < queue
                                     "eval": {"batch_size": 12, "linear": {"epochs": [3], "lrs": [0.01],
                                                                           "weight_decays": [0.0]}}})
    results = []
    for seed in (0, 1):
        plan = plan_study(config, tmp_path / f"seed{seed}")
        plan.config.seed = seed
        plan.encoders.update({key: healthy for key in rows} | {"coclr_k1_rgb": collapsed})
        plan.out.mkdir(parents=True)
        results.append(write_results(plan, evaluate_rows(plan), [], 0.0))
    by_key = {row["row"]: row for row in results[0]["rows"]}
    assert [key for key, row in by_key.items() if row["collapsed"]] == ["coclr_k1_rgb"]
    assert all(0 <= row["linear_top1"] <= 100 for row in by_key.values())  # the other rows go on as usual
    markdown = (tmp_path / "seed0" / "results.md").read_text()
    assert "| CoCLR K=1 ‡ | RGB |" in markdown and "| CoCLR | RGB |" in markdown
    assert "- CoCLR K=1 (RGB): ‡ collapsed encoder: degenerate features in the retrieval evaluation" in markdown
    claim_lines = [line for line in markdown.splitlines() if line.startswith("- CoCLR-RGB K=5 >= K=1 and K=50")]
    assert len(claim_lines) == 2 and all("rests on a collapsed encoder: CoCLR K=1 (RGB)" in line
                                         for line in claim_lines)
    assert not any("rests on" in line for line in markdown.splitlines() if "K=5" not in line)
    table = (tmp_path / "seed0" / "table.md").read_text()
    assert "| CoCLR K=1 ‡ | RGB |" in table and table.count("‡ degenerate features") == 2  # K=1: probe and R@1
    assert "| CoCLR K=50 | RGB |" in table
    seeds = seeds_markdown(summarise_seeds(results))
    assert "| CoCLR K=1 ‡ | RGB |" in seeds and "| CoCLR K=50 | RGB |" in seeds
    assert "- CoCLR K=1 (RGB): ‡ its encoder collapsed on 2 of 2 seeds" in seeds
    assert "rests on a collapsed encoder: CoCLR K=1 (RGB) on 2 of 2 seeds" in seeds


def test_a_row_is_collapsed_only_when_both_splits_carry_nothing():
    """A weak encoder can sit within the noise of chance on one split's nearest neighbours (seed 4's InfoNCE-RGB:
    test 14.3 % against chance 12.0 %, train 17.4 %, retrieval R@1 22.9 %); a collapsed one carries nothing on
    either split."""
    from coclr.eval.health import collapsed, health_warnings
    from coclr.eval.report import degenerate

    def stream(train: bool, test: bool) -> dict:
        split = {"relative_variance": 0.7, "effective_rank": 7.0, "nn_accuracy": 14.0, "chance": 12.0}
        return {"view": "rgb", "checkpoint": "enc.pth", "train": {**split, "degenerate": train},
                "test": {**split, "degenerate": test}}

    for train, test in ((True, False), (False, True), (False, False)):
        assert not collapsed(stream(train, test)) and not health_warnings([stream(train, test)])
        assert not degenerate({"feature_health": [stream(train, test)]})
    assert collapsed(stream(True, True)) and len(health_warnings([stream(True, True)])) == 1
    assert degenerate({"feature_health": [stream(False, False), stream(True, True)]})


def test_a_damaged_entry_met_by_the_study_s_evaluation_says_what_to_do(store_and_encoders, tmp_path,
                                                                         monkeypatch) -> None:
    """The study stopped on "damaged entry: ... checksum expected ..." and said nothing of what to do (coclr eval
    adds it): running the same command again rebuilds the entry."""
    from coclr.config import from_dict, merge
    from coclr.errors import DataError
    from coclr.store.clipstore import DamagedEntryError
    from coclr.study import run
    from coclr.study.config import STUDY_TRAIN, StudyConfig
    from coclr.study.plan import plan_study

    store, healthy, _, _ = store_and_encoders
    config = from_dict(StudyConfig, {"rows": ["infonce_rgb"], "columns": ["retrieval"],
                                     "data": {"source": "store", "store": str(store)},
                                     "train": merge(STUDY_TRAIN, {"run": {"batch_size": 2}})})
    plan = plan_study(config, tmp_path / "study")
    plan.encoders.update({"infonce_rgb": healthy})
    plan.out.mkdir(parents=True)

    def damaged(*args, **kwargs):
        raise DamagedEntryError("damaged entry: store S, video 'v', entry rgb/ab/x.frames: frame 5 checksum ...")

    monkeypatch.setattr(run, "evaluate_checkpoint", damaged)
    with pytest.raises(DataError, match=r"frame 5 checksum \.\.\.; now listed as failed: run the same command "
                                        r"again, whose store or flow job rebuilds the entry$"):
        run.evaluate_rows(plan)
