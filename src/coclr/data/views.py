"""View names: which views are stored, which are derived from a stored one, and which are optical flow.

Views are ``"rgb"``, flow views (``"flow"``, and other backends' names starting with ``"flow"``, e.g.
``"flow_dis"``) and ``"rgbdiff"``, computed on the fly from RGB and never stored.
"""

from __future__ import annotations

DERIVED_VIEWS = {"rgbdiff": "rgb"}
"""Views computed on the fly from a stored view (``rgbdiff`` reads one RGB frame more than its length)."""


def stored_view(view: str) -> str:
    """The stored view a (possibly derived) view reads its frames from."""
    return DERIVED_VIEWS.get(view, view)


def is_flow_view(view: str) -> bool:
    """Flow views (``flow``, ``flow_dis``, ...) have one frame fewer than the RGB they come from."""
    return view.startswith("flow")
