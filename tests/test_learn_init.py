"""``coclr learn --init``: the starting checkpoints read and checked before any work, the plan of their network,
the pipeline's InfoNCE stages started from them, and a whole run that measures them beside every stage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coclr.errors import CheckpointError, ConfigError
from coclr.learn.budget import MODELS, SUGGESTION_HEADROOM, Model, choose_plan, least_steps
from test_learn import TINY_PLAN, costs, encoder_file, footage

SMALL, WIDER = MODELS[0], MODELS[1]


# ------------------------------------------------------------------------------------------------ the plan


def test_a_starting_checkpoint_fixes_the_network_and_the_budget_sizes_its_schedule():
    measured = costs({SMALL: 100, WIDER: 150})
    free = choose_plan(footage(), measured, budget=900)
    assert free.model == WIDER
    fixed = choose_plan(footage(), measured, budget=900, fixed=SMALL)
    assert fixed.model == SMALL and fixed.steps > free.steps  # the cheaper network gets every second left
    assert "the starting checkpoint's network" in " ".join(fixed.reasons)
    assert sum(fixed.estimates.values()) <= 900


def test_a_starting_flow_checkpoints_bound_replaces_the_footages_in_the_plans_reasons(tmp_path):
    """The plan said both "flow clipped to +-1.5 px (the footage's motion ...)" and "+-1.3 px, as the starting flow
    checkpoint's inputs were", of which the second was used."""
    from coclr.learn.init import read_starts
    from coclr.learn.run import with_starts

    plan = choose_plan(footage(), costs({SMALL: 100, WIDER: 150}), budget=900, fixed=SMALL)
    assert "the footage's motion" in " ".join(plan.reasons)
    starts = read_starts(encoder_file(tmp_path / "rgb.pth", "rgb"),
                         encoder_file(tmp_path / "flow.pth", "flow", flow_bound=1.3))
    with_starts(plan, starts)
    said = " ".join(plan.reasons)
    assert plan.flow_bound == 1.3 and "flow clipped to +-1.3 px, as the starting flow checkpoint's" in said
    assert "the footage's motion" not in said and "training instances: a video" in said


def test_a_budget_short_of_one_epoch_of_the_checkpoints_network_is_refused_naming_one_that_does():
    measured = costs({SMALL: 2000})  # 2 s a step: 768 videos, batch 32 -> 24 steps an epoch, 8 epochs at least
    least = least_steps(footage(), SMALL)
    assert least == 24 * 8
    with pytest.raises(ConfigError, match="cannot afford one epoch") as refused:
        choose_plan(footage(), measured, budget=300, fixed=SMALL)
    message = str(refused.value)
    assert "\n" not in message and f"{least} steps" in message
    minutes = int(message.split("--budget ")[-1].split("m")[0])
    plan = choose_plan(footage(), measured, budget=60 * minutes, fixed=SMALL)  # the budget it names does
    assert plan.steps >= least
    with pytest.raises(ConfigError):  # the suggestion is the least one, but for its headroom
        choose_plan(footage(), measured, budget=60 * (minutes - 1) / SUGGESTION_HEADROOM, fixed=SMALL)


def test_a_fixed_network_need_not_be_one_of_the_candidates():
    odd = Model(0.125, 48, 8)
    measured = costs({SMALL: 100})
    for table in ("step", "lone_step", "single_step", "forward", "epoch", "stage", "start"):
        getattr(measured, table)[odd.key] = getattr(measured, table).get(SMALL.key, 0.1)
    for table in ("store_frame", "flow_pair"):
        getattr(measured, table)[48] = 1e-4
    plan = choose_plan(footage(), measured, budget=900, fixed=odd)
    assert plan.model == odd and math.isfinite(plan.estimates["coclr"])


# ------------------------------------------------------------------------------------------ reading the starts


def test_the_starting_checkpoints_are_read_and_checked_before_any_work(tmp_path):
    from coclr.learn.init import read_starts, recorded_starts

    rgb = encoder_file(tmp_path / "rgb.pth", "rgb")
    flow = encoder_file(tmp_path / "flow.pth", "flow", flow_bound=2.5)
    starts = read_starts(rgb, flow)
    assert starts["rgb"].model == SMALL and starts["flow"].model == SMALL
    assert starts["flow"].flow_bound == 2.5 and starts["rgb"].format == "ours"
    assert recorded_starts(starts) == {"rgb": starts["rgb"].sha256, "flow": starts["flow"].sha256}
    assert read_starts(None, None) == {}
    with pytest.raises(ConfigError, match="--init: .*flow.pth is an encoder of 'flow' clips.*give it as --flow-init"):
        read_starts(flow, None)
    with pytest.raises(ConfigError, match="--flow-init: .*rgb.pth .*give it as --init"):
        read_starts(None, rgb)
    differences = encoder_file(tmp_path / "diff.pth", "rgbdiff")  # (it said "give it as neither option")
    with pytest.raises(ConfigError, match=r"--init: .*diff\.pth is an encoder of 'rgbdiff' clips, not of rgb ones; "
                       r"coclr learn trains rgb and flow encoders only: give one of those$"):
        read_starts(differences, None)
    with pytest.raises(CheckpointError, match="--init: checkpoint not found"):
        read_starts(tmp_path / "absent.pth", None)
    with pytest.raises(CheckpointError, match="--init: .* is a folder, not a checkpoint file"):
        read_starts(tmp_path, None)  # (it was "checkpoint not found")
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    settings = {"clip_settings": {"view": "rgb", "length": 8, "size": 32}}
    gated = save_encoder(tmp_path / "gated.pth", build_encoder(width=0.125, gating=True), meta=settings)
    with pytest.raises(ConfigError, match="--init: .*gated.pth is an S3D-G encoder"):
        read_starts(gated, None)  # (refused only when its stage started, after the store and the flow)
    other = save_encoder(tmp_path / "other.pth", build_encoder(width=0.125, embed_dim=64), meta=settings)
    with pytest.raises(ConfigError, match="--init: .*other.pth's projection head gives 64 dimensions"):
        read_starts(other, None)
    assert read_starts(save_encoder(tmp_path / "bare.pth", build_encoder(width=0.125, embed_dim=None),
                                    meta=settings), None)["rgb"].model == SMALL  # a backbone alone starts one
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="junk.pth"):
        read_starts(tmp_path / "junk.pth", None)
    wide = encoder_file(tmp_path / "wide.pth", "flow", width=0.25)
    with pytest.raises(ConfigError, match="different networks or clips"):
        read_starts(rgb, wide)


def test_a_starting_encoders_copy_records_the_clips_of_the_runs_store(tmp_path):
    """The copy recorded the length, size and bound only: exported (every trained stage of its view collapsed), it
    embedded at the default short side of 128, not the store's, and the two-stream pass refused it ("short_side
    differ(s)") after the whole budget, every time the command was run again. It records what a stage trained on the
    run's store records; a copy written before is written again."""
    from coclr.embed.settings import resolve_settings
    from coclr.learn.init import copy_starts, read_starts, start_file
    from coclr.models.loading import read_clip_settings

    starts = read_starts(encoder_file(tmp_path / "rgb.pth", "rgb"),
                         encoder_file(tmp_path / "flow.pth", "flow", flow_bound=2.5))
    files = copy_starts(tmp_path / "run", starts)
    for view, bound in (("rgb", None), ("flow", 2.5)):
        recorded = read_clip_settings(files[view])
        assert recorded["short_side"] == 32 and recorded["stride"] == 1 and recorded["flow_bound"] == bound, recorded
        assert recorded["fps"] is None and len(recorded["mean"]) == 3
    assert resolve_settings(files["rgb"]).short_side == 32
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    save_encoder(start_file(tmp_path / "run", "rgb"), build_encoder(width=0.125),
                 meta={"clip_settings": {"view": "rgb", "length": 8, "size": 32}})  # (as a copy was written before)
    copy_starts(tmp_path / "run", starts)
    assert read_clip_settings(start_file(tmp_path / "run", "rgb"))["short_side"] == 32


def test_the_authors_checkpoint_starts_the_papers_network(fixtures_dir):
    from coclr.learn.init import read_starts

    starts = read_starts(fixtures_dir / "official_infonce_s3d_format.pth.tar", None)
    assert starts["rgb"].format == "authors_pretrain"
    assert starts["rgb"].model == Model(1.0, 128, 32)  # the paper's clips: the authors' files record none


# ------------------------------------------------------------------------------------------------ the pipeline


def test_the_pipeline_starts_each_infonce_stage_from_its_checkpoint(tmp_path):
    from coclr.config import from_dict
    from coclr.learn.budget import Plan
    from coclr.learn.recipe import pipeline_options
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import plan_stages, stage_config

    plan = Plan.from_dict(TINY_PLAN)
    options = pipeline_options(plan, str(tmp_path / "store"), str(tmp_path / "run"), 0, "cpu", 64,
                               starts={"rgb": "start_rgb.pth"})
    config = from_dict(PipelineConfig, options)
    stages = plan_stages(config)
    assert [stage.init_file for stage in stages[:2]] == ["start_rgb.pth", None]
    assert stage_config(config, stages[0], tmp_path).method.init_checkpoint == "start_rgb.pth"
    assert stage_config(config, stages[1], tmp_path).method.init_checkpoint == ""
    assert stage_config(config, stages[2], tmp_path).method.init_checkpoint.endswith("infonce_rgb/encoder_rgb.pth")
    scratch = from_dict(PipelineConfig, pipeline_options(plan, str(tmp_path / "store"), str(tmp_path / "run"), 0,
                                                         "cpu", 64))
    assert scratch.pipeline.init is None and scratch.pipeline.second_init is None  # unchanged: no key recorded
    options["pipeline"]["infonce_from"] = str(tmp_path)
    with pytest.raises(ConfigError, match="init"):
        from_dict(PipelineConfig, options)


# ------------------------------------------------------------------------------------------ the label scores


def test_each_stage_is_scored_on_the_labelled_videos_it_measured():
    from coclr.learn.scores import stage_scorer
    from coclr.learn.stages import video_features

    names = ["a.mp4", "b.mp4", "c.mp4", "d.mp4"]
    videos = np.array([0, 0, 1, 2, 2, 3])  # two stretches of a and c
    features = np.array([[1.0, 0], [1.0, 0.2], [0.9, 0.1], [0, 1.0], [0.1, 1.0], [0.0, 0.9]])
    keys, means = video_features(names, videos, features)
    assert keys == names and np.allclose(means[0], [1.0, 0.1]) and np.allclose(means[2], [0.05, 1.0])
    labels = {"videos": {"/r/a.mp4": (0, "train"), "/r/b.mp4": (0, "test"), "/r/c.mp4": (1, "train"),
                         "/r/d.mp4": (1, "test")}}
    scores = stage_scorer(labels, "/r")(keys, means)
    assert scores["R@1"] == 100.0 and scores["queries"] == 2  # the test videos query the train ones
    assert stage_scorer({"videos": {"/r/a.mp4": (0, "train")}}, "/r")(keys, means) is None
