"""Progress bars for long work: stabilizations (warm starts included), ``incr gc`` and the
benchmark runner. Optional: the bars are drawn by ``rich`` (``pip install 'incr[progress]'``).

Off by default in library code; turn it on for one runtime::

    import incr, incr.progress
    rt = incr.Runtime(store=".incr")
    incr.progress.attach(rt)          # a bar on stderr for every pass longer than 0.5 s

or for every runtime :func:`attach` is given, and for the command line, with the environment
variable ``INCR_PROGRESS``: ``1`` draws on any stream (a log file, CI), ``0`` never draws.
Without it a bar is drawn only when the stream is a terminal (``isatty()``): output that goes
to a file or a pipe stays clean. The ``incr`` command draws bars when stderr is a terminal
(``--progress`` forces them, ``--no-progress`` turns them off).

A bar of a pass shows what the pass has done so far: the cells that ran, the values taken from
the store (a warm start is mostly these), the elapsed time. How many cells a pass will run is
not known until it is over, so a pass's bar counts and has no end. ``callback=`` receives the
same counts as :class:`Counts` (every ``interval`` seconds, and once with ``final=True`` when
the pass ends: then ``ran`` and ``loaded`` are exactly the pass's ``recomputed`` and
``loaded``); it needs no ``rich``.

Asking for a bar without ``rich`` installed raises ImportError naming the extra; the command
line then prints that once and goes on without bars. Nothing is printed for a bar that was not
asked for.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import attrs

__all__ = ["Counts", "attach", "bar", "wanted"]

_EXTRA = "progress bars need rich: pip install 'incr[progress]' (or rich)"


@attrs.frozen
class Counts:
    """What a stabilization pass has done so far (``final``: the pass is over)."""
    revision: int
    ran: int                  # cell runs (cut off ones included)
    loaded: int               # values taken from the store without running
    reused: int               # instances verified up to date without running
    seconds: float
    final: bool = False


def wanted(file: TextIO | None = None, asked: bool | None = None) -> bool:
    """Whether to draw bars on ``file`` (default stderr): ``asked`` if given, else
    ``INCR_PROGRESS`` (1 or 0) if set, else whether ``file`` is a terminal."""
    if asked is not None:
        return asked
    env = os.environ.get("INCR_PROGRESS", "").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    if env in ("0", "false", "no", "off"):
        return False
    return _isatty(sys.stderr if file is None else file)


def _isatty(f: Any) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        return False


def _rich() -> Any:
    try:
        import rich.progress
    except ImportError as e:
        raise ImportError(f"incr.progress: {_EXTRA}") from e
    return rich.progress


class _Bar:
    """One rich progress display on ``file`` (internal); total None: a counter, no end."""

    def __init__(self, description: str, total: int | None, file: TextIO | None,
                 transient: bool, redirect: bool = False):
        rp = _rich()
        from rich.console import Console
        f = sys.stderr if file is None else file
        # force_terminal: drawn because it was asked for (or the stream is a terminal)
        console = Console(file=f, force_terminal=True)
        columns = [rp.SpinnerColumn(), rp.TextColumn("{task.description}")]
        if total is not None:
            columns += [rp.BarColumn(), rp.MofNCompleteColumn()]
        columns += [rp.TextColumn("{task.fields[detail]}"), rp.TimeElapsedColumn()]
        self.progress = rp.Progress(*columns, console=console, transient=transient,
                                    redirect_stdout=redirect and _isatty(sys.stdout),
                                    redirect_stderr=False)
        self.task = self.progress.add_task(description, total=total, detail="")
        self.progress.start()

    def update(self, completed: int | None = None, total: int | None = None,
               description: str | None = None, detail: str | None = None) -> None:
        kw: dict[str, Any] = {}
        if completed is not None:
            kw["completed"] = completed
        if total is not None:
            kw["total"] = total
        if description is not None:
            kw["description"] = description
        if detail is not None:
            kw["detail"] = detail
        self.progress.update(self.task, **kw)

    def close(self) -> None:
        self.progress.stop()


class _Null:
    def update(self, *a: Any, **k: Any) -> None:
        pass

    def close(self) -> None:
        pass


def bar(description: str, total: int | None = None, *, file: TextIO | None = None,
        asked: bool | None = None, transient: bool = False, redirect: bool = False) -> Any:
    """A progress bar (``update(completed=, total=, description=, detail=)``, ``close()``)
    if :func:`wanted`, else one that draws nothing. ``redirect``: lines printed to stdout
    meanwhile appear above the bar (when stdout is a terminal too). Raises ImportError naming
    the extra when a bar is wanted and ``rich`` is missing."""
    if not wanted(file, asked):
        return _Null()
    return _Bar(description, total, file, transient, redirect)


def _stats(rt: Any) -> tuple[int, int, int] | None:
    try:
        s = rt.stats()
    except RuntimeError:     # a table grew while it was summed (another thread): next tick
        return None
    return s["computed"] + s["recomputed"] + s["failed"], s["store_hits"], s["reused"]


class _Watch:
    """Follows the passes of one runtime (internal): a ticker thread per pass."""

    def __init__(self, rt: Any, draw: bool, file: TextIO | None, min_seconds: float,
                 callback: Callable[[Counts], Any] | None, interval: float):
        self.rt, self.draw, self.file = rt, draw, file
        self.min_seconds, self.callback, self.interval = min_seconds, callback, interval
        self.lock = threading.Lock()
        self.stop: threading.Event | None = None
        self.thread: threading.Thread | None = None
        self.start: tuple[int, int, int] = (0, 0, 0)
        self.t0 = 0.0
        self.bar: Any = None

    def counts(self, revision: int, final: bool = False, ran: int | None = None) -> Counts:
        now = _stats(self.rt) or self.start
        d = [a - b for a, b in zip(now, self.start)]
        return Counts(revision, d[0] if ran is None else ran, d[1], d[2],
                      time.perf_counter() - self.t0, final)

    def tick(self, stop: threading.Event, revision: int) -> None:
        while not stop.wait(self.interval):
            c = self.counts(revision)
            if self.callback is not None:
                self.callback(c)
            if self.draw and c.seconds >= self.min_seconds:
                with self.lock:
                    if stop.is_set():
                        return
                    if self.bar is None:
                        self.bar = _Bar(f"stabilizing revision {revision}", None, self.file,
                                        transient=True)
                    self.bar.update(completed=c.ran,
                                    detail=f"{c.ran} ran, {c.loaded} from the store, "
                                           f"{c.reused} reused")

    def __call__(self, event: Any) -> None:
        from incr import events
        if isinstance(event, events.PassStarted):
            if self.stop is not None:       # a pass that ended without PassFinished
                self.stop.set()
            self.start = _stats(self.rt) or (0, 0, 0)
            self.t0 = time.perf_counter()
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self.tick, args=(self.stop, event.revision),
                                           name="incr-progress", daemon=True)
            self.thread.start()
        elif isinstance(event, events.PassFinished) and self.stop is not None:
            self.stop.set()
            with self.lock:
                if self.bar is not None:
                    self.bar.close()
                    self.bar = None
            thread, self.thread, self.stop = self.thread, None, None
            if thread is not None and thread is not threading.current_thread():
                thread.join()
            if self.callback is not None:
                self.callback(self.counts(event.revision, final=True,
                                          ran=len(event.recomputed)))


def attach(rt: Any, *, file: TextIO | None = None, asked: bool | None = None,
           min_seconds: float = 0.5, callback: Callable[[Counts], Any] | None = None,
           interval: float = 0.1) -> Callable[[], None]:
    """Follow every stabilization pass of ``rt``: a bar on ``file`` (default stderr) for a
    pass that lasts ``min_seconds`` or more, when :func:`wanted` (``asked``, else
    ``INCR_PROGRESS``, else whether ``file`` is a terminal); ``callback(Counts)`` every
    ``interval`` seconds and at the end of every pass. Returns a function that detaches.

    Raises ImportError naming the extra when a bar is wanted and ``rich`` is missing (a
    ``callback`` alone needs nothing). Cost: one thread per pass, waking every ``interval``
    to read ``rt.stats()`` (O(number of cells)); nothing when the pass is short.
    """
    draw = wanted(file, asked)
    if draw:
        _rich()
    if not draw and callback is None:
        return lambda: None
    watch = _Watch(rt, draw, file, min_seconds, callback, interval)
    unsubscribe = rt.on_event(watch)

    def detach() -> None:
        unsubscribe()
        if watch.stop is not None:      # a pass interrupted (Ctrl-C) sent no PassFinished
            watch.stop.set()
        with watch.lock:
            if watch.bar is not None:
                watch.bar.close()
                watch.bar = None
    return detach
