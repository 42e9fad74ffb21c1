"""Attacks the one-thread-at-a-time rule: threads call public methods of one runtime at once
(demands, ``Input.set``, batches, ``stabilize``, ``observe``, ``Observer.value``/``stop``,
``rt.nack``/``rt.state``, ``explain``, ``stats`` and, in the ``close`` mode, ``close()``),
with a tiny thread switch interval so that calls interleave inside one another.

Every call must work or raise ``incr.IncrError`` (or a subclass): never a crash, never another
exception type, never a value that mixes two revisions, and afterwards the trace invariants
hold and values equal from-scratch. Each run is a child process
(tests/chaos/progs/threads_child.py), so that a segfault fails one test and names the signal.
"""

from __future__ import annotations

import pytest

from chaos_util import chaos, finish, spawn  # noqa: F401 - chaos is a fixture

pytestmark = pytest.mark.hang_limit(300)


@pytest.mark.parametrize("on_store", [False, True], ids=["memory", "store"])
@pytest.mark.parametrize("mode", ["open", "close"])
def test_threads_share_one_runtime(tmp_path, chaos, mode, on_store):
    problems = []
    for seed in chaos.rounds(4, 20, "processes"):
        store = tmp_path / f"store{seed}" if on_store else "-"
        res = finish(spawn("threads_child.py", seed, 4, 500, mode, store), timeout=120)
        for k in ("calls", "ok", "incr_errors", "bad_count", "inconsistent_count"):
            chaos.count(k, res[k])
        chaos.count("wrong_values", len(res["final_wrong"]))
        if res["bad"] or res["inconsistent"] or res["final_wrong"]:
            problems.append({k: res[k] for k in ("bad", "inconsistent", "final_wrong")})
    assert problems == [], problems
