"""The options of the paper's evaluation protocols, each declared once with its documentation: how test clips are
cut (:class:`ClipConfig`), the linear probe's grid (:class:`LinearProbeConfig`) and finetuning
(:class:`FinetuneConfig`). ``coclr eval``, ``coclr report`` and the study read them; the flags are generated from
them (:func:`coclr.cli._options.add_option_flags`). Light to import: the command line reads them first."""

from __future__ import annotations

import dataclasses

from coclr.clips import ClipSettings, clip_option
from coclr.config import option, require, require_learning_rate, require_milestones
from coclr.errors import ConfigError
from coclr.seeding import check_seed
from coclr.threads import check_workers


@dataclasses.dataclass
class ClipConfig:
    """How test clips are cut from a video and fed to the backbone."""

    length: int = clip_option("length")
    stride: int = clip_option("stride")
    size: int = clip_option("size")
    batch_size: int = option(16, "clips per forward pass; in finetuning, the training batch too (a setting of its "
                                 "result)")
    workers: int = option(0, "DataLoader worker processes reading the store (0: read in this process)")
    amp: bool = option(False, "run the backbone under autocast (float16 on CUDA; bfloat16 on a CPU with bfloat16 "
                              "instructions, AVX512_BF16 or AMX, and refused on others)")

    def validate(self) -> None:
        ClipSettings.check(self)
        require(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        check_workers(self.workers, "workers")

    def data_key(self) -> dict[str, object]:
        """The options that change the features (batch size and workers change only their rounding: not keyed, see
        :mod:`coclr.eval.features`)."""
        return {**ClipSettings.of(self).to_dict(), "amp": self.amp}

    @property
    def clips(self) -> ClipSettings:
        return ClipSettings.of(self)


@dataclasses.dataclass
class LinearProbeConfig:
    """Grid and training options of the linear probe."""

    lrs: list[float] = option([1e-3, 1e-2], "Adam learning rates tried")
    weight_decays: list[float] = option([0.0, 1e-4, 1e-3], "weight decays tried")
    epochs: list[int] = option([10, 30, 100], "epoch counts tried (scored along one run per lr/weight decay)")
    batch_size: int = option(256, "videos per step", cli={"flag": "--probe-batch-size"})
    val_fraction: float = option(0.2, "fraction of each train class held out to choose the hyper-parameters")
    seed: int = option(0, "seed of the held-out split, the initialisation and the batch order")

    def validate(self) -> None:
        require(bool(self.lrs), "lrs", "give at least one learning rate")
        for lr in self.lrs:
            require_learning_rate(lr, "lrs")
        check_seed(self.seed)
        require(bool(self.weight_decays) and all(wd >= 0 for wd in self.weight_decays), "weight_decays",
                f"need values >= 0, got {self.weight_decays}")
        require(bool(self.epochs) and all(e >= 1 for e in self.epochs), "epochs",
                f"need values >= 1, got {self.epochs}")
        require(self.batch_size >= 2, "batch_size", f"must be >= 2 (the probe's batch-norm needs two videos a "
                f"step), got {self.batch_size}")
        require(0.0 < self.val_fraction < 1.0, "val_fraction", f"must be in (0, 1), got {self.val_fraction}")


@dataclasses.dataclass
class FinetuneConfig:
    """Options of end-to-end finetuning (clip options, batch size and workers come from :class:`ClipConfig`)."""

    epochs: int = option(100, "training epochs; the model after the last one is tested (no test-set selection)")
    lr: float = option(1e-3, "Adam learning rate of the classifier")
    backbone_lr_scale: float = option(0.1, "backbone learning rate = lr x this (the paper: 0.1)")
    weight_decay: float = option(1e-3, "Adam weight decay")
    milestones: list[int] = option([60, 80], "epochs after which the learning rates are multiplied by 0.1",
                                   cli={"nargs": "*"})
    dropout: float = option(0.9, "dropout before the linear classifier (the paper: 0.9)")
    ten_crop_short_side: int = option(0, "short side the frames are resized to before the ten crops "
                                      "(0: round(size * 8 / 7), so the corner crops differ from the centre)")
    seed: int = option(0, "seed of the classifier initialisation and of every epoch's randomness")

    def validate(self) -> None:
        require(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        require_milestones(self.milestones, self.epochs, "milestones", "epochs",
                           "--milestones with no value, or [] in a config,")
        require_learning_rate(self.lr, "lr")
        check_seed(self.seed)
        require(self.backbone_lr_scale >= 0, "backbone_lr_scale", f"must be >= 0, got {self.backbone_lr_scale}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        require(self.ten_crop_short_side >= 0, "ten_crop_short_side", f"must be >= 0, got {self.ten_crop_short_side}")


def check_ten_crops(config: FinetuneConfig, size: int, key: str = "--ten-crop-short-side") -> None:
    """Refuse, before any training, a test short side (``key``) the ten ``size`` px crops do not fit in."""
    if 0 < config.ten_crop_short_side < size:
        raise ConfigError(f"{key} {config.ten_crop_short_side}: the ten {size} px crops do not fit in frames of that "
                          f"short side; give at least {size} (the clips' size), or 0 for {round(size * 8 / 7)}")
