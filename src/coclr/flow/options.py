"""The options of a flow extraction (``coclr flow``, :func:`coclr.store.flow_extract.extract_flow`): each declared
once with its documentation, the command's flags generated from them. Light to import (no torch, no OpenCV)."""

from __future__ import annotations

import dataclasses

from coclr.config import option
from coclr.flow.backends import ALIASES, BACKENDS, backends_help
from coclr.flow.encode import FLOW_BOUND
from coclr.flow.params import FAST_STOP_EVERY, MODES

KERNELS = ("auto", "torch", "triton", "c")
"""What runs ``tvl1-torch``'s iterations (:mod:`coclr.flow.tvl1`)."""
JPEG_ENCODERS = ("opencv", "nvjpeg")
"""What encodes ``tvl1-torch``'s flow frames."""
BATCH_PAIRS = {"cpu": 64, "cuda": 256}
"""Frame pairs ``tvl1-torch`` solves together by default, by device type: a GPU needs more of the small frames at
once to fill it (docs/tvl1.md); the same flow whatever the batch."""


@dataclasses.dataclass
class FlowOptions:
    """How flow is extracted; each is a flag of ``coclr flow``."""

    backend: str = option("auto", backends_help(), cli={"choices": (*BACKENDS, *ALIASES)})
    view: str | None = option(None, "view name to write (training takes a view as flow by its name: flow, "
                                    "flow_...)", cli={"shown": "'flow' for TV-L1, 'flow_dis' for DIS"})
    workers: int | None = option(None, "worker processes for the CPU backends, JPEG processes for tvl1-torch (0: "
                                       "none, work in this process, as DataLoader's num_workers)",
                                 cli={"shown": "one per core"})
    split: str | None = option(None, "only the videos of this split: train, val or test",
                               cli={"shown": "every video of the store"})
    device: str | None = option(None, "torch device for tvl1-torch, e.g. cpu, cuda, cuda:1",
                                cli={"shown": "cuda when available"})
    bound: float = option(FLOW_BOUND, "clip flow to +-BOUND px before storing it as uint8 (one step is 2*BOUND/255 "
                                      "px); 20 is the I3D convention for frames of 128 px or more: scale it with the "
                                      "frame size (5 at 32 px). A resumed extraction must use the view's bound")
    mode: str = option("exact", "tvl1-torch: exact tests for stopping after every inner iteration as OpenCV does; "
                                "fast tests every --stop-every iterations, which the GPU runs as one fused pass "
                                "(Middlebury error within 2% of OpenCV's, stored flow within 0.5 units of exact). A "
                                "view keeps the mode it was started with", cli={"choices": MODES})
    stop_every: int = option(FAST_STOP_EVERY, "fast mode: inner iterations between stop tests")
    batch_pairs: int | None = option(None, "tvl1-torch: frame pairs solved together, taken across videos",
                                     cli={"shown": ", ".join(f"{n} on {'a GPU' if kind == 'cuda' else 'the CPU'}"
                                                             for kind, n in BATCH_PAIRS.items())})
    kernels: str = option("auto", "tvl1-torch: what runs the iterations; auto: the fused Triton kernels on CUDA when "
                                  "Triton imports, the fused C loops on the CPU when a C compiler builds them, else "
                                  "PyTorch operations", cli={"choices": KERNELS})
    jpeg: str = option("opencv", "tvl1-torch: encode flow frames with OpenCV in worker processes, or with nvJPEG on "
                                 "the GPU (needs torchvision; its JPEG bytes differ slightly from OpenCV's)",
                       cli={"choices": JPEG_ENCODERS})
