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


def check_views(store, views: list[str] | None) -> list[str]:
    """The views to check (``None``: every view of the store); an unknown one is a :class:`DataError` naming the
    store's views, before any work."""
    chosen = views or store.views()
    unknown = [view for view in chosen if view not in store.views()]
    if unknown:
        raise DataError(f"{store.root}: no view {', '.join(map(repr, unknown))} (views: "
                        f"{', '.join(store.views()) or 'none'})")
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
            if problem is None and store.checksum(key, view) is None:
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
