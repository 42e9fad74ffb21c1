"""Shared pieces of the chaos suite (tests/chaos): the ``chaos`` fixture that sizes each loop
and records what it did, and helpers for child processes.

Sizing: every loop has a CI count and a CI time; ``--long`` (or ``INCR_CHAOS_LONG=1``) multiplies
both by ``LONG_FACTOR`` (tests/conftest.py). A loop stops at whichever comes first and reports
how many rounds it really ran.

Recording: a test calls ``chaos.count(name, n=1)`` as things happen (kills, interrupts, records
fuzzed, wrong values...). When the test ends, its summary is one JSON line appended to the file
named by ``INCR_CHAOS_REPORT`` (if set), and one line of the "incr chaos" section that pytest
prints at the end of the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from conftest import chaos_scale

HERE = os.path.dirname(os.path.abspath(__file__))
PROGS = os.path.join(HERE, "progs")


class Chaos:
    """One test's loop budget and tally (the ``chaos`` fixture)."""

    def __init__(self, nodeid: str, scale: int):
        self.nodeid = nodeid
        self.scale = scale
        self.long = scale > 1
        self.tally: Counter[str] = Counter()
        self.t0 = time.monotonic()

    def n(self, ci_count: int) -> int:
        """The number of rounds for a loop whose CI size is ``ci_count``."""
        return ci_count * self.scale

    def rounds(self, ci_count: int, ci_seconds: float, name: str = "rounds"):
        """Yield round numbers: ``n(ci_count)`` of them, or fewer once ``ci_seconds`` (times the
        scale) have passed since the first. Counts them under ``name``."""
        stop = time.monotonic() + ci_seconds * self.scale
        for i in range(self.n(ci_count)):
            if i and time.monotonic() > stop:
                self.count("stopped_on_time")
                return
            self.count(name)
            yield i

    def count(self, what: str, n: int = 1) -> None:
        self.tally[what] += n

    def summary(self) -> dict:
        return {"test": self.nodeid, "long": self.long, "scale": self.scale,
                "seconds": round(time.monotonic() - self.t0, 2), **dict(sorted(self.tally.items()))}


class _Summary:
    """A plugin registered by the first chaos test: prints the tallies at the end of the run."""

    def __init__(self):
        self.lines: list[dict] = []

    def pytest_terminal_summary(self, terminalreporter):
        if not self.lines:
            return
        terminalreporter.section("incr chaos")
        for s in self.lines:
            rest = " ".join(f"{k}={v}" for k, v in s.items() if k not in ("test", "long", "scale"))
            terminalreporter.write_line(f"{s['test']}: {rest}")


@pytest.fixture
def chaos(request):
    config = request.config
    plugin = config.pluginmanager.get_plugin("incr-chaos-summary")
    if plugin is None:
        plugin = _Summary()
        config.pluginmanager.register(plugin, "incr-chaos-summary")
    c = Chaos(request.node.nodeid, chaos_scale(config))
    yield c
    s = c.summary()
    plugin.lines.append(s)
    path = os.environ.get("INCR_CHAOS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(s) + "\n")


# -- child processes ---------------------------------------------------------------------------

def how_it_ended(rc: int | None) -> str:
    """A return code in words: 'exit 0', 'exit 3', 'killed by SIGSEGV'."""
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def prog(name: str) -> str:
    return os.path.join(PROGS, name)


def spawn(name: str, *args, stdin=None) -> subprocess.Popen:
    """Start tests/chaos/progs/NAME with these arguments (text pipes for stdout and stderr;
    faulthandler on, so that a crash leaves the Python stacks on stderr)."""
    return subprocess.Popen([sys.executable, "-X", "faulthandler", prog(name), *map(str, args)],
                            stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=PROGS)


def finish(child: subprocess.Popen, timeout: float) -> dict:
    """Wait for ``child``; it must exit 0 and print a JSON line last, which is returned."""
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        raise AssertionError(f"child {child.args[1:]} did not end in {timeout} s\n{err[-3000:]}")
    assert child.returncode == 0, (
        f"child {child.args[1:]} ended with {how_it_ended(child.returncode)}\n{err[-3000:]}")
    lines = out.strip().splitlines()
    assert lines, f"child {child.args[1:]} printed nothing\n{err[-3000:]}"
    return json.loads(lines[-1])


def reap(children) -> None:
    """Kill what is still running (only these children) and wait for them."""
    for c in children:
        if c.poll() is None:
            c.kill()
        c.wait()
        for f in (c.stdin, c.stdout, c.stderr):
            if f is not None:
                f.close()
