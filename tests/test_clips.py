"""One ClipSettings: every command's clip options take their defaults and checks from it."""

from __future__ import annotations

import dataclasses

import pytest

from coclr.clips import CLIP_KEYS, PAPER_CLIPS, ClipSettings, recorded_clips
from coclr.config import from_dict
from coclr.embed.settings import EmbedSettings
from coclr.errors import ConfigError
from coclr.eval.features import ClipConfig
from coclr.train.config import DataOptions, PretrainConfig

CONFIGS = (DataOptions, ClipConfig, EmbedSettings)


def defaults(config_class: type) -> dict[str, object]:
    fields = {field.name: field for field in dataclasses.fields(config_class)}
    return {key: fields[key].default for key in CLIP_KEYS}


def test_every_config_takes_the_one_default() -> None:
    assert PAPER_CLIPS == {"length": 32, "stride": 1, "size": 128}
    for config_class in CONFIGS:
        assert defaults(config_class) == PAPER_CLIPS, config_class


@pytest.mark.parametrize("key, value", [("length", 7), ("stride", 0), ("size", 31), ("size", 100_000),
                                        ("length", 100_000)])  # a typo asked for hundreds of GB per clip
def test_every_config_refuses_the_same_clips(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=key):
        ClipSettings(**{**PAPER_CLIPS, key: value}).validate()
    with pytest.raises(ConfigError, match=f"data.{key}"):
        from_dict(PretrainConfig, {"data": {"store": "s", key: value}})
    with pytest.raises(ConfigError, match=key):
        from_dict(ClipConfig, {key: value})
    with pytest.raises(ConfigError, match=key):
        from_dict(EmbedSettings, {key: value})


def test_configs_give_their_clips_and_records_are_read_alike() -> None:
    data = from_dict(DataOptions, {"store": "s", "length": 16, "size": 64})
    assert data.clips == ClipSettings(16, 1, 64)
    assert from_dict(ClipConfig, {"stride": 2}).clips == ClipSettings(32, 2, 128)
    assert recorded_clips({"view": "rgb", "length": 8, "size": None}) == {"length": 8}


@pytest.mark.parametrize("given, said", [(["--size", "100000"], "--size: 32 frames of 100000 x 100000 px are"),
                                         (["--length", "100000"], "--length: 100000 frames of"),
                                         (["--short-side", "100000"], "--short-side: must be a whole number of")])
def test_a_clip_no_memory_holds_is_refused_before_any_work(tmp_path, capsys, given, said) -> None:
    """``coclr embed --size 100000`` failed every video on a 900 GB allocation; ``--length 100000`` was killed for
    memory. Both are one line now, before the output folder is made."""
    from coclr.cli import main
    from test_embed import moving_square, write_video
    from test_eval_helpers import save_tiny_encoder

    write_video(tmp_path / "videos" / "v.mp4", moving_square(8))
    checkpoint = save_tiny_encoder(tmp_path / "encoder.pt")
    out = tmp_path / "out"
    assert main(["embed", str(tmp_path / "videos"), "--checkpoint", str(checkpoint), "--out", str(out), "--quiet",
                 *given]) == 2
    assert said in capsys.readouterr().err
    assert not out.exists()
