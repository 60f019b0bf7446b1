"""The one progress line of ``coclr learn``: the measurement's, then the whole run's, each with an ETA.

:class:`ProgressLine` follows the parts' bars (:func:`coclr.progress.observed`) and advances by each phase's
estimated seconds (:class:`~coclr.learn.budget.Plan`) as its parts report; its ETA is what the estimates leave,
scaled by how fast the work goes: the current phase's remainder at that phase's own pace once it has reported some
of its work, the later phases at the pace of the whole run so far. So an estimate that was wrong is corrected as
soon as its phase reports, instead of being averaged with the phases that went as planned.
:class:`MeasureLine` shows the measurement that comes before the plan (probing the videos, then each candidate
network), with the seconds :func:`~coclr.learn.budget.measuring_left` predicts.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator

from coclr.progress import clock, job_line

SETTLED = 0.05
"""A phase's own pace is trusted once this share of its estimate has been reported."""
REDRAW_SECONDS = 1.0
"""How often the line is drawn again while nothing reports (its clock and ETA move on)."""


class ProgressLine:
    """One line for the whole run (see the module docstring).

    State: the tqdm line; the current phase, its units (bar updates it expects; None: it only ends), the seconds of
    its estimate credited so far and when it started; the estimated and the actual seconds of the phases done."""

    def __init__(self, estimates: dict[str, float], enabled: bool = True, done: Collection[str] = (),
                 tick: Callable[[], None] | None = None, took: dict[str, float] | None = None,
                 before: float | None = None, sized: Collection[str] = ()) -> None:
        """``done``: phases finished before the line starts (the measurement; a resumed run's phases finished by
        its earlier parts), ``took`` their seconds (default: their estimates); their phases, run again, only find
        their work done and leave the line as it is. ``before``: the seconds the run took before the line starts,
        which its clock counts (default: those of ``done``). ``tick``: called at every update (a run records its
        time with it). ``sized``: phases sized to the time left as they start (learn's CoCLR stages): the run's pace
        so far does not stretch their estimate, which their sizing keeps (the ETA said 6 minutes where 2 were left)."""
        self.estimates = dict(estimates)
        self.sized = frozenset(sized)
        self.enabled = enabled
        self.tick = tick
        self.bar = None
        self.current: str | None = None
        self.units: int | None = None
        self.credited = 0.0
        self.credited_before = 0.0
        self.phase_started = 0.0
        self.started = {name for name in done if name in self.estimates}
        self.finished = frozenset(self.started)
        self.estimated_done = sum(self.estimates[name] for name in self.started)
        self.actual_done = sum((took or {}).get(name, self.estimates[name]) for name in self.started)
        self.before = self.actual_done if before is None else before
        self.closed = threading.Event()
        self.redraw: threading.Thread | None = None

    def __enter__(self) -> ProgressLine:
        self.bar = job_line(total=sum(self.estimates.values()), initial=self.estimated_done,
                        disable=not self.enabled, file=sys.__stderr__, dynamic_ncols=True, smoothing=0.0,
                        delay=1e-6,  # (not drawn as it is made: its clock, moved back below, would say 00:00 first)
                        bar_format="coclr learn: {desc} {percentage:3.0f}%|{bar:20}| {elapsed} so far{postfix}")
        if hasattr(self.bar, "start_t"):  # (a disabled bar keeps no time)
            self.bar.start_t -= self.before  # "so far" counts the measurement, and a resumed run's earlier parts
        self._show()
        if self.enabled:
            self.redraw = threading.Thread(target=self._redraw, name="coclr-learn-line", daemon=True)
            self.redraw.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closed.set()
        if self.redraw is not None:  # a drawing under way ends before the bar closes (none after it)
            self.redraw.join(5)
        self.bar.close()

    def _redraw(self) -> None:
        """Draw the line every :data:`REDRAW_SECONDS` until it closes: a phase that reports nothing for a while (the
        quality measures, the curation) still shows its clock and its ETA counting down."""
        while not self.closed.wait(REDRAW_SECONDS):
            with contextlib.suppress(Exception):  # a drawing that failed is not the run's failure
                self._show()

    @contextlib.contextmanager
    def phase(self, name: str, units: int | None) -> Iterator[None]:
        """Run a phase: its parts' updates advance the line by its estimate per unit; at its end the line stands
        at the phase's full estimate (a resumed phase has less to do). A phase finished before the line started
        only finds its work done: the line, and the pace it measures, stay as they are."""
        if name in self.finished:
            self.bar.set_description_str(name, refresh=False)
            yield
            return
        self.current, self.units, self.credited, self.credited_before = name, units, 0.0, 0.0
        self.phase_started = time.monotonic()
        self.started.add(name)
        self.bar.set_description_str(name, refresh=False)
        self._show()
        yield
        self._credit(self.estimates.get(name, 0.0) - self.credited)
        self.estimated_done += self.estimates.get(name, 0.0) - self.credited_before  # (what this part's time paid)
        self.actual_done += time.monotonic() - self.phase_started
        self.current, self.credited, self.credited_before = None, 0.0, 0.0

    def resize(self, units: int, estimate: float) -> None:
        """The current phase sized anew: ``units`` updates in all, ``estimate`` seconds (a phase whose later parts
        are sized as they start)."""
        if self.current is None:
            return
        change = estimate - self.estimates.get(self.current, 0.0)
        self.estimates[self.current], self.units = estimate, units
        self.bar.total = max(self.bar.n, self.bar.total + change)
        self._show()

    def observe(self, desc: str, count: int, total: int | None, earlier: bool = False) -> None:
        """A part's update (:data:`coclr.progress.Observer`): ``count`` more units of the current phase; with
        ``earlier``, units a resumed part finds done (credited, but not to the pace this part's time measures)."""
        if self.tick is not None:
            self.tick()
        if self.current is None or not self.units:
            return
        share = min(self.estimates.get(self.current, 0.0) * count / self.units,
                    self.estimates.get(self.current, 0.0) - self.credited)
        if earlier:
            self.credited_before += max(0.0, share)
        self._credit(share)

    def eta(self) -> float:
        """Seconds left: the current phase's remainder at its own pace (once it reported :data:`SETTLED` of its
        estimate, else at the run's; a phase without units: its estimate at the pace before it, less the time it
        has run), the phases not started at the run's pace (actual over estimated seconds of the work done so far, the
        current phase's reported share included)."""
        elapsed = time.monotonic() - self.phase_started if self.current is not None else 0.0
        paid = self.credited - self.credited_before  # the current phase's work done in ``elapsed``
        estimated, actual = self.estimated_done + paid, self.actual_done + elapsed
        pace = actual / estimated if estimated > 0 else 1.0

        def later(at: float) -> float:  # the phases not started, at the pace ``at`` (a sized one at its estimate)
            return sum(seconds * (1.0 if name in self.sized else at) for name, seconds in self.estimates.items()
                       if name not in self.started)

        if self.current is None:
            return later(pace)
        estimate = self.estimates.get(self.current, 0.0)
        if not self.units:  # a phase that only ends: its estimate at the pace before it, less the time it has run
            before = self.actual_done / self.estimated_done if self.estimated_done > 0 else 1.0
            if elapsed <= estimate * before:
                return estimate * before - elapsed + later(before)
            return later((self.actual_done + elapsed) / (self.estimated_done + estimate))  # over: as if it ended
        remainder = max(0.0, estimate - self.credited)
        own = elapsed / paid if paid > SETTLED * estimate and paid > 0 else pace
        return remainder * own + later(pace)

    def _show(self) -> None:
        self.bar.set_postfix_str(f"about {clock(self.eta())} left", refresh=True)

    def _credit(self, seconds: float) -> None:
        if seconds > 0:
            self.credited += seconds
            self.bar.update(min(seconds, self.bar.total - self.bar.n))  # (never past the end by a rounding)
        self._show()


class MeasureLine:
    """The line of the measurement before the plan: the videos probed, then each part measured, with the elapsed
    seconds and the seconds left (as predicted, counting down between predictions; "?" until a prediction can be
    made), drawn again every :data:`REDRAW_SECONDS` (a part that reports nothing for a while still shows its
    clock)."""

    def __init__(self, videos: int, enabled: bool = True) -> None:
        self.videos = videos
        self.enabled = enabled
        self.bar = None
        self.count = 0
        self.left: float | None = None
        self.since = time.monotonic()
        self.closed = threading.Event()
        self.redraw: threading.Thread | None = None
        self.lock = threading.Lock()

    def __enter__(self) -> MeasureLine:
        self.bar = job_line(total=self.videos, disable=not self.enabled, file=sys.__stderr__, dynamic_ncols=True,
                            desc=f"probing the videos (0 of {self.videos})", postfix="about ? left",
                            bar_format="coclr learn: measuring: {desc} | {elapsed} so far{postfix}")
        if self.enabled:
            self.redraw = threading.Thread(target=self._redraw, name="coclr-learn-measure-line", daemon=True)
            self.redraw.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closed.set()
        if self.redraw is not None:
            self.redraw.join(5)
        self.bar.close()

    def _redraw(self) -> None:
        while not self.closed.wait(REDRAW_SECONDS):
            with contextlib.suppress(Exception), self.lock:  # a drawing that failed is not the run's failure
                self._show()

    def probed(self) -> None:
        """One more video probed."""
        with self.lock:
            self.count += 1
            self.bar.set_description_str(f"probing the videos ({self.count} of {self.videos})", refresh=False)
            self.bar.update(1)

    def measuring(self, what: str, left: float | None) -> None:
        """What is measured now and the seconds the measurement expects it still needs (None: not known)."""
        with self.lock:
            self.left, self.since = left, time.monotonic()
            self.bar.set_description_str(what, refresh=False)
            self._show()

    def remaining(self) -> float | None:
        """The seconds left: the last prediction less the time since it (None: none yet)."""
        return None if self.left is None else max(0.0, self.left - (time.monotonic() - self.since))

    def _show(self) -> None:
        self.bar.set_postfix_str(f"about {clock(self.remaining())} left", refresh=True)
