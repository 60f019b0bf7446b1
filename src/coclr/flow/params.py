"""Parameters of the duality-based TV-L1 optical flow, shared by the OpenCV and PyTorch backends."""

from __future__ import annotations

from dataclasses import dataclass

from coclr.config import option, require
from coclr.errors import ConfigError

MODES = ("exact", "fast")
"""How the PyTorch TV-L1 tests for stopping: ``exact``, OpenCV's test after every inner iteration (OpenCV's
results); ``fast``, the test every ``stop_every`` iterations, so that a GPU runs them as one fused pass (up to
``stop_every - 1`` more iterations per warp)."""
FAST_STOP_EVERY = 5
"""Inner iterations per pass between stop tests in the fast mode (divides OpenCV's 30 inner iterations)."""


@dataclass
class TVL1Params:
    """TV-L1 parameters, with OpenCV DualTVL1's defaults (Zach, Pock and Bischof 2007; IPOL tvl1flow)."""

    tau: float = option(0.25, "time step of the numerical scheme")
    lambda_: float = option(0.15, "weight of the data term (smaller gives smoother flow)")
    theta: float = option(0.3, "tightness of the coupling between the two flow variables")
    nscales: int = option(5, "number of pyramid scales")
    warps: int = option(5, "number of warpings per scale")
    epsilon: float = option(0.01, "stopping threshold on the mean squared flow update of the inner loop")
    inner_iterations: int = option(30, "inner iterations (dual/primal updates) per warp")
    outer_iterations: int = option(10, "outer iterations (warp refinements) per scale")
    scale_step: float = option(0.8, "ratio between the sizes of consecutive pyramid scales")
    gamma: float = option(0.0, "weight of the illumination-change term (0 disables it)")
    median_filtering: int = option(5, "median filter size applied to the flow between warps (0 or 1 disables)")

    def validate(self) -> None:
        require(self.tau > 0, "tau", "must be positive")
        require(self.lambda_ > 0, "lambda_", "must be positive")
        require(self.theta > 0, "theta", "must be positive")
        require(self.nscales >= 1, "nscales", "must be at least 1")
        require(self.warps >= 1, "warps", "must be at least 1")
        require(self.epsilon > 0, "epsilon", "must be positive")
        require(self.inner_iterations >= 1, "inner_iterations", "must be at least 1")
        require(self.outer_iterations >= 1, "outer_iterations", "must be at least 1")
        require(0 < self.scale_step < 1, "scale_step", "must be in (0, 1)")
        require(self.gamma >= 0, "gamma", "must be non-negative")
        require(self.median_filtering in (0, 1, 3, 5), "median_filtering", "must be 0, 1, 3 or 5")


def check_mode(mode: str, stop_every: int) -> None:
    """Raise :class:`ConfigError` naming the option unless ``mode`` (:data:`MODES`) and ``stop_every`` are valid."""
    if mode not in MODES:
        raise ConfigError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if not 1 <= stop_every <= 30:
        raise ConfigError(f"stop_every: must be in 1..30 (inner iterations per fused pass), got {stop_every}")
