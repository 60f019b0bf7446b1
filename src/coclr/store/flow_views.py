"""What a store records of each of its flow views, in its metadata: the bound the flow was clipped to
(``<view>_bound_px``) and how it was computed (``<view>_method``: the backend, the TV-L1 parameters and mode, and for
``tvl1-torch`` the kernels). Extraction (:mod:`coclr.store.flow_extract`) records and checks them; training reads the
bound a flow view was stored with (:mod:`coclr.train.model`)."""

from __future__ import annotations

from coclr.config import to_dict
from coclr.flow.encode import FLOW_BOUND
from coclr.flow.params import FAST_STOP_EVERY, TVL1Params
from coclr.runfolder import FolderRule
from coclr.store.clipstore import ENTRY_SUFFIX, ClipStore


def bound_key(view: str) -> str:
    """The store metadata key that records the flow bound of ``view``."""
    return f"{view}_bound_px"


def method_key(view: str) -> str:
    """The store metadata key that records the backend and TV-L1 parameters of ``view``."""
    return f"{view}_method"


def flow_method(backend: str, params: TVL1Params, mode: str = "exact", stop_every: int = FAST_STOP_EVERY,
                kernels: str | None = None) -> dict:
    """What a flow view records of how it was computed (metadata ``<view>_method``): the backend, the TV-L1
    parameters and mode (and, in the fast mode, the iterations between stop tests), and for ``tvl1-torch`` the
    ``kernels`` that computed it (``c``, ``triton``, ``torch``: they agree to float rounding, not bit for bit); two
    runs that record different methods must not write one view."""
    if backend == "dis":
        return {"backend": backend, "params": None}
    method = {"backend": backend, "params": to_dict(params), "mode": mode}
    if mode == "fast":
        method["stop_every"] = stop_every
    return {**method, "kernels": kernels} if kernels is not None else method


def recorded_method(store: ClipStore, view: str) -> dict | None:
    """The method recorded for ``view`` (:func:`flow_method`); TV-L1 views recorded before modes existed are exact."""
    recorded = store.meta.get(method_key(view))
    if recorded is not None and recorded.get("backend") != "dis" and "mode" not in recorded:
        recorded = {**recorded, "mode": "exact"}
    return recorded


def stored_bound(store: ClipStore, view: str) -> float | None:
    """The flow bound ``view`` was extracted with: the recorded one; the default for a view written before bounds
    were recorded; None for a view not extracted yet."""
    recorded = store.meta.get(bound_key(view))
    if recorded is not None:
        return float(recorded)
    folder = store.root / view
    return FLOW_BOUND if folder.is_dir() and next(folder.rglob("*" + ENTRY_SUFFIX), None) else None


def flow_view_rule(view: str) -> FolderRule:
    """How a flow view is continued or refused (:mod:`coclr.runfolder`): by its bound and method, recorded in the
    store's metadata; extracting more of it otherwise would mix two kinds of flow."""
    return FolderRule("flow", f"flow view {view!r}", may_add=True, other="another view (--view)",
                      shown=lambda settings: _as_options(view, settings))


def _as_options(view: str, settings: dict) -> dict:
    """A flow view's recorded settings in the words of ``coclr flow``'s options (``--bound``, ``--backend``,
    ``--mode``, ``--kernels``, the TV-L1 parameters as its ``key=value`` overrides), as a refusal names them."""
    shown = {}
    for key, value in settings.items():
        if key == bound_key(view):
            shown["--bound"] = value
        elif key == method_key(view) and isinstance(value, dict):
            named = {"backend": "--backend", "mode": "--mode", "kernels": "--kernels", "stop_every": "--stop-every"}
            shown.update((named.get(part, part), setting) for part, setting in value.items() if part != "params")
            shown.update(value.get("params") or {})
        else:
            shown[key] = value
    return shown


def recorded_settings(store: ClipStore, view: str) -> dict:
    """The bound and method ``view`` records (:func:`stored_bound`, :func:`recorded_method`; none for a view not
    extracted yet)."""
    recorded = {bound_key(view): stored_bound(store, view), method_key(view): recorded_method(store, view)}
    return {key: value for key, value in recorded.items() if value is not None}
