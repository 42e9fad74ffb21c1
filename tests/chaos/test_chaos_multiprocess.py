"""Attacks several processes on one store: four writers (in CI) start together on a store whose
map starts tiny (256 KiB), so it grows many times while the others read and write; two of them
trim the store at every close() (``max_bytes``) while the others use it; each reopens its
runtime now and then. Every value each process gets is compared with the plain function, and a
fresh process then reads everything back and must get the from-scratch values too.

The writers are tests/chaos/progs/mp_child.py; they start on a ``go`` line after each reported
``ready``, so that they really overlap.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from chaos_util import chaos, finish, reap, spawn  # noqa: F401 - chaos is a fixture
from incr.store import Store

pytestmark = pytest.mark.hang_limit(300)

MAP = 256 << 10


def test_processes_share_a_growing_store(tmp_path, chaos):
    store = tmp_path / "store"
    nproc = 4 if not chaos.long else 6
    rounds = chaos.n(40)
    children = []
    try:
        for seed in range(nproc):
            trim = 400_000 if seed % 2 else 0
            children.append(spawn("mp_child.py", store, seed, rounds, MAP, trim,
                                  stdin=subprocess.PIPE))
        for c in children:
            line = c.stdout.readline()
            assert line == "ready\n", (line, c.stderr.read() if not line else "")
        for c in children:
            c.stdin.write("go\n")
            c.stdin.flush()
        results = [finish(c, timeout=120 * chaos.scale) for c in children]
    finally:
        reap(children)
    chaos.count("processes", nproc)
    for r in results:
        chaos.count("demands", r["demands"])
        chaos.count("reopens", r["reopens"])
        chaos.count("store_hits", r["store_hits"])
        chaos.count("wrong_values", len(r["wrong"]))
        chaos.count("errors", len(r["errors"]))
    assert [r["errors"] for r in results] == [[]] * nproc
    assert [r["wrong"] for r in results] == [[]] * nproc
    size = os.path.getsize(store / "data.mdb")
    chaos.count("data_mdb_bytes", size)
    assert size > 4 * MAP, "the map never grew: the test did not test growth"

    # every record decodes, and a fresh process gets the from-scratch values
    s = Store(store)
    try:
        recs = list(s.iter_records())
    finally:
        s.close()
    chaos.count("records_checked", len(recs))
    assert recs and all(rec is not None for _k, rec, _n in recs)
    fresh = finish(spawn("mp_child.py", store, 0, "verify", 12), timeout=120)
    chaos.count("wrong_values", len(fresh["wrong"]))
    assert fresh["errors"] == [] and fresh["wrong"] == []
    assert fresh["store_hits"] > 0
