"""Hostile tests, round 3 (branch attack, written against contract2 at 30b65a1).

Each ``xfail(strict=True)`` test is one finding and FAILS on the code it was written against
(its reason says what is wrong and where the fix probably is); the tests without a mark are
attacks that found nothing and pin what held. Long random soaks run only with INCR_SOAK=1.
"""

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import incr
from incr.errors import IncrError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOAK = os.environ.get("INCR_SOAK") == "1"


def _subprocess(code, timeout=60):
    """Run ``code`` in a fresh interpreter (a hang or a crash there is a finding, not a hung
    or crashed test run). Returns (returncode or "HANG", output)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                           capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "HANG", out
    return p.returncode, p.stdout + p.stderr


# -- (1) Ctrl-C ------------------------------------------------------------------------------


class _CtrlC:
    """Stands in for incr.remote.Ahead: Ctrl-C arrives while a pass sets up its run-ahead."""

    def __init__(self, rt):
        raise KeyboardInterrupt


@pytest.mark.xfail(strict=True, reason=(
    "Ctrl-C while stabilize_pass sets up run-ahead (ahead_start, incr/_core_stabilize.pxi) is "
    "outside its try/finally: rt.stabilizing stays True (every later Input.set and stabilize "
    "raise ReentrancyError for good) and rt.dirty_observed was already emptied (the observed "
    "instances are lost, I5). Move `rt.stabilizing = True ... ahead_start(rt)` (and the "
    "emptying of dirty_observed) inside the try."))
def test_ctrl_c_while_a_pass_starts_its_run_ahead_leaves_the_runtime_usable(monkeypatch):
    import incr.remote
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 1)

    @incr.llm
    def gen(*, previous=None, feedback=()):
        return x.get() * 10

    o = rt.observe(gen)
    rt.stabilize()
    assert o.value == 10
    x.set(2)
    with monkeypatch.context() as m:
        m.setattr(incr.remote, "Ahead", _CtrlC)
        with pytest.raises(KeyboardInterrupt):
            rt.stabilize()
    x.set(3)                      # ReentrancyError: "while the runtime is stabilizing"
    rt.stabilize()
    assert o.value == 30
    rt._check()
