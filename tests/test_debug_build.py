"""The debug build: the engine's own tests again, on a core that checks every invariant of the
trace after each top-level operation and aborts on a broken one (docs/internals.md,
"Invariants"; ``INCR_DEBUG=1``).

The property machines call ``rt._check()`` after every step they take; the debug build also
checks after every operation *inside* those steps and in every other test listed below (a
demand, a stabilize, an async operation), including the ones that are interrupted or cancelled.
A broken invariant ends the child process with SIGABRT and the list of what is broken, so this
test fails with that list.

It compiles the core again (a minute or two on 2 cores), so it runs only where ``.ci/run``
asks for it (``INCR_CI_DEBUG=1``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The tests run on the debug build: the engine's property machines (each compares the engine
# with from-scratch evaluation), concurrency, async, cancellation, threads and interrupts.
SUITE = [
    "tests/test_state_machine.py",
    "tests/test_llm_properties.py",
    "tests/test_async_properties.py",
    "tests/test_collections_machine.py",
    "tests/test_basics.py",
    "tests/test_concurrency.py",
    "tests/test_llm_concurrency.py",
    "tests/test_threads.py",
    "tests/test_exceptions.py",
    "tests/test_cycles.py",
    "tests/test_llm_control.py",
    "tests/test_async.py",
    "tests/test_attack_async.py",
    "tests/test_concurrency_cells.py",
    "tests/test_llm_halt.py",
]
# Open bugs, each a strict xfail in the ordinary suite: on the debug build they abort the
# process at the broken invariant instead of failing as expected, so they are left out here.
OPEN: list = []   # (none open now)


# (its own subprocess timeouts bound it; conftest's 300 s hang guard would end it while the
# core compiles on a loaded machine)
@pytest.mark.hang_limit(5400)
def test_the_debug_build_finds_no_broken_invariant(tmp_path):
    if os.environ.get("INCR_CI_DEBUG") != "1":
        pytest.skip("needs the debug build, compiled here (minutes on 2 cores): .ci/run sets "
                    "INCR_CI_DEBUG=1")
    copy = tmp_path / "tree"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.so", "*.c", "__pycache__", ".incr", "*.egg-info",
        ".pytest_cache", ".hypothesis"))
    env = dict(os.environ, INCR_DEBUG="1")
    env.pop("PYTHONPATH", None)
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=copy, env=env, capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stderr[-4000:]
    probe = subprocess.run([sys.executable, "-c", "import incr, incr._core as c; "
                            "print(c.DEBUG, incr.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.split()[0] == "True", probe.stdout + probe.stderr
    assert probe.stdout.split()[1].startswith(str(copy)), probe.stdout
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          "-x", *SUITE, *[f"--deselect={t}" for t in OPEN]], cwd=copy, env=env, capture_output=True, text=True,
                         timeout=3600)
    out = ran.stdout + ran.stderr
    assert "invariant is broken" not in out, out[-6000:]
    assert ran.returncode == 0, out[-6000:]
