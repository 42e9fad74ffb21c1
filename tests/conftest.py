"""Shared helpers for incr's tests.

Tests assert *what ran*, not only values (Salsa's ``assert_logs``): cell bodies append their
name to a :class:`Log`, and the test takes the log after each step and compares it with what
should have run. Every test that uses the ``rt`` fixture also has the trace invariants checked
(``rt._check()``) when it ends.
"""

from __future__ import annotations

from collections import Counter

import pytest

import incr


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


def label(cell, *args):
    """The label incr gives to the instance ``cell(*args)``: ``qualname(repr(arg), ...)``."""
    return f"{cell.__qualname__}({', '.join(repr(a) for a in args)})"


@pytest.fixture
def log():
    return Log()


@pytest.fixture
def rt():
    """A fresh in-memory runtime whose trace invariants are checked when the test ends."""
    runtime = incr.Runtime()
    yield runtime
    runtime._check()
