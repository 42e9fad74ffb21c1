"""Attacks crash safety: SIGKILL at random times of a writer's life (import, open, compute, commit)
and of ``incr gc`` (reading, folding the usage log, deleting), sometimes both at once on one
store. Then the store must still open, every record must decode and hold the value a plain
from-scratch computation gives, and a fresh process must get exactly the from-scratch values,
taking what is stored from the store.

The writer is tests/store_progs/crash_child.py (one commit per top-level demand, forever) and
the model is tests/store_progs/crash_model.py; the store check is test_store_crash's. Unlike
test_store_crash, the kill lands at a random *time*, not after a chosen number of commits, and
``incr gc`` is killed too.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from chaos_util import chaos, how_it_ended, reap  # noqa: F401 - chaos is a fixture
from store_progs.crash_model import work_value
from test_store_crash import CHILD, PROGS, _check_store

pytestmark = pytest.mark.hang_limit(300)


def _writer(store, salt, start):
    return subprocess.Popen([sys.executable, CHILD, str(store), str(salt), str(start)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=PROGS)


def _gc(store, keep_runs):
    return subprocess.Popen([sys.executable, "-m", "incr.cli", "gc", str(store),
                             "--keep-runs", str(keep_runs), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_at(child, when, chaos, what):
    """Sleep until ``when`` (monotonic), then SIGKILL ``child`` if it still runs."""
    time.sleep(max(0.0, when - time.monotonic()))
    if child.poll() is None:
        child.send_signal(signal.SIGKILL)
        chaos.count(f"{what}_killed")
    else:
        chaos.count(f"{what}_finished")
    rc = child.wait(timeout=30)
    err = child.stderr.read()
    assert rc in (0, -signal.SIGKILL), f"{what} ended with {how_it_ended(rc)}\n{err[-3000:]}"


def _verify_fresh(store, salt, idx):
    """A new process demands work(i) for i in idx: its values and what it took from the store."""
    proc = subprocess.run([sys.executable, CHILD, str(store), str(salt), "--verify", *map(str, idx)],
                          capture_output=True, text=True, timeout=120, cwd=PROGS)
    assert proc.returncode == 0, f"{how_it_ended(proc.returncode)}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sigkill_writers_and_gc_at_random_times(tmp_path, chaos):
    rng = random.Random(0xC4A05)
    store = tmp_path / "store"
    for round_ in chaos.rounds(16, 40):
        salt = rng.randrange(3)
        writer = _writer(store, salt, rng.randrange(300))
        gc = None
        try:
            t0 = time.monotonic()
            if round_ % 3 == 2:
                # gc while a writer commits, and each killed at its own random time
                time.sleep(rng.uniform(0.3, 0.8))
                gc = _gc(store, rng.choice([1, 1, 2]))
                kills = [(t0 + rng.uniform(0.4, 1.6), writer, "writer"),
                         (time.monotonic() + rng.uniform(0.0, 0.9), gc, "gc")]
                for when, child, what in sorted(kills, key=lambda k: k[0]):
                    _kill_at(child, when, chaos, what)
            else:
                _kill_at(writer, t0 + rng.uniform(0.05, 1.5), chaos, "writer")
        finally:
            reap([writer] + ([gc] if gc else []))
        if round_ % 5 == 4 and store.exists():
            # (on a loaded machine every writer so far may have been killed while still
            # starting up, before it made the store: nothing to check yet)
            _check_store(store)
            chaos.count("store_checks")

    stored = _check_store(store)
    chaos.count("store_checks")
    chaos.count("records_checked", sum(len(v) for v in stored.values()))
    assert sum(len(v) for v in stored.values()) > 0, "no writer ever committed"
    wrong = 0
    for salt in (0, 1, 2):
        have = sorted(stored.get(salt, ()))
        idx = have[:30] + [5000, 5001]          # stored ones, and two never computed
        res = _verify_fresh(store, salt, idx)
        for i in idx:
            if res["values"][str(i)] != json.loads(json.dumps(work_value(i, salt))):
                wrong += 1
        assert res["stats"]["store_hits"] >= len(have[:30]), res["stats"]
    chaos.count("wrong_values", wrong)
    assert wrong == 0
