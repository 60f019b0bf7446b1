"""View names: which views are stored, which are derived from a stored one, and which are optical flow.

Views are ``"rgb"``, flow views (``"flow"``, and other backends' names starting with ``"flow"``, e.g.
``"flow_dis"``) and ``"rgbdiff"``, computed on the fly from RGB and never stored.
"""

from __future__ import annotations

from collections.abc import Mapping

from coclr.errors import ConfigError
from coclr.flow.backends import is_flow_view

VIEW_KINDS = ("rgb", "flow", "rgbdiff")
"""What a view holds: RGB frames, optical flow, or RGB frame differences."""
DERIVED_VIEWS = {"rgbdiff": "rgb"}
"""Views computed on the fly from a stored view (``rgbdiff`` reads one RGB frame more than its length)."""


def stored_view(view: str) -> str:
    """The stored view a (possibly derived) view reads its frames from."""
    return DERIVED_VIEWS.get(view, view)


def view_kind(name: str, kinds: Mapping[str, str] | None = None) -> str:
    """The kind of the view ``name``: ``kinds[name]`` if given, else by name.

    The naming rule: ``"rgb"`` -> rgb, ``"rgbdiff"`` -> rgbdiff, any name starting with ``"flow"`` -> flow
    (``"flow"``, ``"flow_dis"``, ...). Other names must be mapped explicitly in ``kinds``.
    """
    if kinds and name in kinds:
        kind = kinds[name]
        if kind not in VIEW_KINDS:
            raise ConfigError(f"kinds[{name!r}]: {kind!r} is not one of {', '.join(VIEW_KINDS)}")
        return kind
    if name in ("rgb", "rgbdiff"):
        return name
    if is_flow_view(name):
        return "flow"
    mapped = f", or map it to one of {', '.join(VIEW_KINDS)} in kinds" if kinds is not None else ""
    raise ConfigError(f"view {name!r}: unknown kind; name it 'rgb', 'rgbdiff' or 'flow...' (a view's kind is read from "
                      f"its name: flow views start with 'flow'){mapped}")

