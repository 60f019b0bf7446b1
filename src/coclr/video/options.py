"""What ``coclr data index`` asks (:mod:`coclr.video.indexes` builds the index): each option declared once, with its
documentation, and which layouts each applies to; the command's flags are generated from it
(:func:`coclr.cli._options.add_option_flags`). Light to import: the command line reads it."""

from __future__ import annotations

import dataclasses

from coclr.config import option
from coclr.errors import DataError
from coclr.seeding import check_seed

FORMATS = ("ucf101", "hmdb51", "kinetics", "folder", "csv")
"""The dataset layouts an index is built from."""


@dataclasses.dataclass
class IndexOptions:
    """How an index is built from a layout (:data:`FORMATS`); each is a flag of ``coclr data index``."""

    root: str | None = option(None, "folder of the videos (entry paths are relative to it)")
    annotations: list[str] | None = option(None, "split files folder, annotation CSV(s) or manifest")
    split: int = option(1, "official split number for ucf101/hmdb51 (1-3)")
    name: str | None = option(None, "index name", cli={"shown": "from the dataset"})
    test_fraction: float = option(0.0, "folder: put about this fraction of each class's videos in the test split, "
                                       "by source group (UCF101 names or <class>/<source>/<clip> subfolders), "
                                       "deterministically; for a plain <class>/<video> folder (a "
                                       "<split>/<class>/<video> folder is split already)")
    seed: int = option(0, "folder with --test-fraction: seed of the split")
    unlabelled: bool = option(False, "folder: every video under --root, at any depth, without labels (your own "
                                     "footage); the folder holding a video is its source group (a camera, a "
                                     "recording); a root of train/, val/, test/ folders keeps those splits. "
                                     "Self-supervised training (InfoNCE, CoCLR, CMC), the store and flow "
                                     "take such an index; what needs labels (UberNCE, supervised training, linear "
                                     "probe, finetuning, retrieval R@k) refuses it")
    drop_missing: bool = option(False, "leave out videos missing under --root instead of failing (e.g. deleted "
                                       "Kinetics videos)")

    def check(self, layout: str) -> None:
        """Refuse, in one line before any work, what the ``layout`` (a :data:`FORMATS` name) cannot take."""
        check_seed(self.seed, "--seed")
        if self.name is not None and not self.name.strip():  # (it was ignored: the dataset's name was kept)
            raise DataError("--name: empty; give a name, or leave --name out for the dataset's own")
        annotations = self.annotations or []
        if layout in ("ucf101", "hmdb51", "csv") and len(annotations) != 1:
            raise DataError(f"--format {layout} needs exactly one --annotations path")
        if layout in ("kinetics", "folder") and not self.root:
            raise DataError(f"--format {layout} needs --root")
        if self.unlabelled and layout != "folder":
            raise DataError(f"--unlabelled applies to --format folder (a csv manifest without a label column is "
                            f"unlabelled already), not {layout}")
        if self.test_fraction and layout != "folder":
            raise DataError(f"--test-fraction applies to --format folder, not {layout} (which has its own splits)")
        # options the layout would ignore without a word
        if annotations and layout == "folder":
            raise DataError("--annotations applies to --format ucf101, hmdb51, kinetics and csv, not folder (whose "
                            "labels are its subfolders)")
        if self.split != 1 and layout not in ("ucf101", "hmdb51"):
            raise DataError(f"--split applies to --format ucf101 and hmdb51 (their official splits), not {layout}")
        if self.seed and not self.test_fraction:
            raise DataError("--seed applies with --test-fraction (the seed of that split) only")
        if self.drop_missing and not self.root:
            raise DataError("--drop-missing needs --root (the folder the videos are looked for in)")
        if layout == "kinetics" and not annotations:
            raise DataError("--format kinetics needs --annotations CSV file(s)")
