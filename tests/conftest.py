"""Shared helpers for incr's tests.

Tests assert *what ran*, not only values (Salsa's ``assert_logs``): cell bodies append their
name to a :class:`Log`, and the test takes the log after each step and compares it with what
should have run. Every test that uses the ``rt`` fixture also has the trace invariants checked
(``rt._check()``) when it ends.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections import Counter

import pytest

import incr


def _adapters_from_this_checkout() -> None:
    """``incr.adapters`` is the ``adapters/`` directory next to the ``incr`` being tested.

    An editable install maps ``incr.adapters`` to the checkout it was installed from; a test
    run from another checkout (a git worktree, with PYTHONPATH on it) would otherwise test that
    checkout's adapters."""
    import importlib.util
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(incr.__file__))),
                        "adapters")
    init = os.path.join(here, "__init__.py")
    if "incr.adapters" in sys.modules or not os.path.isfile(init):
        return
    spec = importlib.util.spec_from_file_location("incr.adapters", init,
                                                  submodule_search_locations=[here])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["incr.adapters"] = mod
    spec.loader.exec_module(mod)
    incr.adapters = mod


_adapters_from_this_checkout()


class Log:
    """What ran, in order. Cell bodies call ``log(name)``; tests call ``log.take()``."""

    def __init__(self):
        self.items = []

    def __call__(self, item):
        self.items.append(item)

    append = __call__

    def take(self):
        """The entries since the last take, in order; clears them."""
        out, self.items = self.items, []
        return out

    def counts(self):
        """The entries since the last take, counted; clears them."""
        return Counter(self.take())


def name(cell):
    """The name incr shows for a cell: its qualname, without the ``outer.<locals>.`` prefix
    a cell defined inside a function (as in these tests) carries."""
    return cell.__qualname__.rsplit("<locals>.", 1)[-1]


def label(cell, *args):
    """The label incr gives to the instance ``cell(*args)``: ``qualname(repr(arg), ...)``."""
    return f"{name(cell)}({', '.join(repr(a) for a in args)})"


@pytest.fixture
def log():
    return Log()


@pytest.fixture
def rt():
    """A fresh in-memory runtime whose trace invariants are checked when the test ends."""
    runtime = incr.Runtime()
    yield runtime
    runtime._check()


_HANG_REPORT = {}

LONG_FACTOR = 20   # --long / INCR_CHAOS_LONG=1: the soak mode of tests/chaos


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help=f"soak mode for tests/chaos: every loop runs {LONG_FACTOR}x its CI "
                          f"count and time (also: environment INCR_CHAOS_LONG=1)")


def chaos_scale(config):
    """How many times its CI count each chaos loop runs: 1, or LONG_FACTOR in soak mode."""
    long = config.getoption("--long", False) or os.environ.get("INCR_CHAOS_LONG") == "1"
    return LONG_FACTOR if long else 1


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "hang_limit(seconds): end the run if this test takes longer (a hang guard)")
    # pytest captures fd 2 while tests run; the hang report must reach the real stderr
    try:
        capman = config.pluginmanager.getplugin("capturemanager")
        fd = capman._global_capturing.err.targetfd_save  # pytest internals, hence the fallback
        _HANG_REPORT["file"] = os.fdopen(os.dup(fd), "w")
    except Exception:
        _HANG_REPORT["file"] = sys.__stderr__


def pytest_unconfigure(config):
    f = _HANG_REPORT.pop("file", None)
    if f is not None and f is not sys.__stderr__:
        f.close()


@pytest.fixture(autouse=True)
def _watchdog(request):
    """Turn a hang into a failure. The engine runs its loops in C, where no signal reaches them,
    so past the limit faulthandler prints every thread's stack (naming the test) and ends the
    process. The limit is generous: it guards against hangs, it does not time anything."""
    marker = request.node.get_closest_marker("hang_limit")
    if marker is not None:
        limit = marker.args[0]
    else:
        limit = 900 if request.node.get_closest_marker("slow") else 300
    limit *= chaos_scale(request.config)   # a soak run is longer, not hung
    out = _HANG_REPORT.get("file") or sys.__stderr__
    faulthandler.dump_traceback_later(limit, exit=True, file=out)
    yield
    faulthandler.cancel_dump_traceback_later()
