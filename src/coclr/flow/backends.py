"""The ways ``coclr flow`` computes optical flow, by name (:func:`coclr.store.flow_extract.resolve_backend` picks
one): the one table the command line, the study and the extraction read. Light to import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coclr.clips import is_flow_view  # noqa: F401 (the one rule of flow view names, kept with the clips')


@dataclass(frozen=True)
class FlowBackend:
    """A way of computing flow: its name, the view it writes by default, and whether it runs on a torch
    device in one process (``gpu``) or in worker processes on the CPU."""

    name: str
    default_view: str
    gpu: bool
    help: str


BACKENDS: dict[str, FlowBackend] = {
    backend.name: backend
    for backend in (
        FlowBackend("tvl1", "flow", False, "OpenCV dual TV-L1 on the CPU (the paper's flow)"),
        FlowBackend("dis", "flow_dis", False, "OpenCV DIS, 'medium' preset (fast, less accurate)"),
        FlowBackend("tvl1-torch", "flow", True, "our TV-L1 on a torch device: fused Triton kernels on a GPU, fused C "
                    "loops on the CPU (OpenCV's scheme and results, several times faster)"),
        FlowBackend("auto", "flow", False, "the backend a view was started with; else tvl1-torch on CUDA, with "
                    "kernels c or triton, in the fast mode, or on a CPU with a C compiler for its loops; else tvl1"),
    )
}



ALIASES = {"torch": "tvl1-torch", "opencv": "tvl1"}
"""Short names accepted for the two TV-L1 backends."""


def backends_help() -> str:
    """The help of ``--backend``: every backend with what it does, then the aliases."""
    return "; ".join(f"{b.name}: {b.help}" for b in BACKENDS.values()) + "; " + ", ".join(
        f"{alias} is short for {name}" for alias, name in ALIASES.items())


def flow_of_method(recorded: Any, view: str | None) -> dict[str, Any] | None:
    """The flow a flow encoder was trained on, as embedding computes it for it, from the method its store's view
    recorded (:func:`coclr.store.flow_views.flow_method`, its checkpoint's ``flow_method``): None for TV-L1 at
    OpenCV's default parameters (the paper's flow; its backends, modes and kernels agree to within rounding of the
    stored flow, docs/tvl1.md), ``{"backend": "dis"}`` for DIS, ``{"backend": "tvl1", "params": {...}}`` for TV-L1
    at other parameters: an encoder is fed the flow it was trained on (it was fed TV-L1 flow whatever its store
    held). A checkpoint that records no method (written before they were recorded, or from elsewhere) is taken at
    its view's name: DIS's default view is DIS flow."""
    if not isinstance(recorded, dict):
        return {"backend": "dis"} if view == BACKENDS["dis"].default_view else None
    if recorded.get("backend") == "dis":
        return {"backend": "dis"}
    params = recorded.get("params")
    if not isinstance(params, dict) or params == _default_params():
        return None
    return {"backend": "tvl1", "params": dict(params)}


def _default_params() -> dict[str, Any]:
    """OpenCV's default TV-L1 parameters as a view records them."""
    from coclr.config import to_dict  # noqa: PLC0415
    from coclr.flow.params import TVL1Params  # noqa: PLC0415

    return to_dict(TVL1Params())
