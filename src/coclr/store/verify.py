"""Checking a store's view entry by entry (``coclr data verify``, ``coclr data info --verify``), and giving
checksums to entries written before them: the rules every caller gets, apart from how the command shows them."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

from coclr.errors import DataError


@dataclass
class ViewCheck:
    """What checking one view found: counts by outcome, and one line per missing or damaged entry."""

    view: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("verified", "damaged", "missing", "unverified", "checksums added"), 0))
    problems: list[str] = field(default_factory=list)
    unlisted: int = 0
    """Damaged entries that could not be listed in the store's failure list (a store that may not be written)."""

    @property
    def bad(self) -> int:
        """How many entries are missing or damaged."""
        return self.counts["damaged"] + self.counts["missing"]


def recorded_views(store) -> list[str]:
    """The views of ``store``: those with a folder, and those it records having written whose folder is gone (their
    settings in its metadata: rgb's JPEG quality, a flow view's method; or a list of their failures or notes), so
    that a deleted view is checked as one of missing entries (it was passed over: no line, exit 0)."""
    from coclr.store.clipstore import FAILED_PREFIX, NOTES_PREFIX, check_view_name  # noqa: PLC0415
    from coclr.store.flow_views import method_key  # noqa: PLC0415

    named = set(store.views())
    if "quality" in store.meta:  # (coclr data store's settings: its rgb view)
        named.add("rgb")
    suffix = method_key("")
    named.update(key[: -len(suffix)] for key in store.meta if key.endswith(suffix) and len(key) > len(suffix))
    for prefix in (FAILED_PREFIX, NOTES_PREFIX):
        named.update(path.name[len(prefix): -len(".json")] for path in store.root.glob(f"{prefix}*.json"))
    views = []
    for view in sorted(named):
        try:
            check_view_name(view)
        except DataError:
            continue
        views.append(view)
    return views


def check_views(store, views: list[str] | None) -> list[str]:
    """The views to check (``None``: every view of the store, :func:`recorded_views`); an unknown one is a
    :class:`DataError` naming the store's views, before any work."""
    known = recorded_views(store)
    chosen = views or known
    unknown = [view for view in chosen if view not in known]
    if unknown:
        raise DataError(f"{store.root}: no view {', '.join(map(repr, unknown))} (views: {', '.join(known) or 'none'})")
    return chosen


def verify_view(store, view: str, decode: bool = False, add: bool = False,
                on_problem: Callable[[str], None] | None = None, progress: bool = True) -> ViewCheck:
    """Check every entry of ``view`` against its checksums (``decode``: also decode every frame): a damaged entry
    goes into the store's failure list (the job that writes the view rebuilds it). With ``add``, under the view's
    writing lock, entries written before checksums are checked with decoding and given them. ``on_problem`` gets
    each missing or damaged entry's line as it is found."""
    from coclr.progress import bar as progress_bar  # noqa: PLC0415
    from coclr.store.jobs import view_lock  # noqa: PLC0415

    found = ViewCheck(view)
    counts = found.counts
    failed = store.failed(view)
    damaged: list[str] = []

    def problem_line(line: str) -> None:
        found.problems.append(line)
        if on_problem is not None:
            on_problem(line)

    with view_lock(store.root, view) if add else nullcontext():
        for key in progress_bar(store.keys(), desc=f"verify {view}", unit="entry", dynamic_ncols=True,
                                disable=not progress):
            problem = store.check_entry(key, view, decode)
            if problem is None and store.checksum(key, view) is None and key in failed and not add:
                entry = store.entry_path(key, view).relative_to(store.root)  # (found damaged before: "0 damaged")
                problem = (f"damaged entry: store {store.root}, video {key!r}, entry {entry}: found damaged before "
                           f"and listed: {failed[key]}")
            elif problem is None and store.checksum(key, view) is None:
                if not add:
                    counts["unverified"] += 1
                    continue
                problem = store.check_entry(key, view, decode=True) if not decode else None
                if problem is None:
                    store.add_checksums(key, view)
                    counts["checksums added"] += 1
                    continue
            if problem is None:
                counts["verified"] += 1
            elif problem == "missing":
                counts["missing"] += 1
                why = f"its job failed: {failed[key]}" if key in failed else "no entry file (deleted, or never written)"
                entry = store.entry_path(key, view).relative_to(store.root)
                problem_line(f"missing entry: store {store.root}, video {key!r}, entry {entry}: {why}")
            else:
                counts["damaged"] += 1
                damaged.append(key)
                problem_line(problem)
    if damaged:
        from coclr.store.clipstore import read_failures  # noqa: PLC0415

        listed = read_failures(store.root, view)
        found.unlisted = sum(key not in listed for key in damaged)
    return found
