"""Several processes on one store at once: they all end with the same stored values, none fails,
a reader never sees part of a commit, and the map grows under load without losing anything.

Children are tests/store_progs/conc_child.py; they start together on a ``go`` line on stdin
(after each reported ``ready``), and the parent moves them through phases with lines on stdin, so
nothing depends on timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from incr.keys import decode
from incr.store import INITIAL_MAP, Store
from store_progs.conc_child import PARTS, big_value, group_value

PROGS = os.path.join(os.path.dirname(__file__), "store_progs")
CHILD = os.path.join(PROGS, "conc_child.py")


def _spawn(*args):
    return subprocess.Popen([sys.executable, CHILD, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROGS)


def _expect(child, word):
    line = child.stdout.readline()
    if line.strip() != word:
        child.kill()
        raise AssertionError(f"expected {word!r} from the child, got {line!r}\n"
                             f"{child.stderr.read()}")


def _send(child, word):
    child.stdin.write(word + "\n")
    child.stdin.flush()


def _finish(child, timeout=90):
    out, err = child.communicate(timeout=timeout)
    assert child.returncode == 0, f"child exited with {child.returncode}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


def _cleanup(children):
    for c in children:
        if c.poll() is None:
            c.kill()
        c.wait()


def _stored(store):
    s = Store(store)
    try:
        return [(k, rec) for k, rec, _size in s.iter_records()]
    finally:
        s.close()


@pytest.mark.slow
@pytest.mark.hang_limit(240)
def test_four_processes_compute_one_store(tmp_path):
    store = tmp_path / "store"
    n = 40
    children = [_spawn("groups", store, seed, n) for seed in range(4)]
    try:
        for c in children:
            _expect(c, "ready")
        for c in children:
            _send(c, "go")
        for c in children:
            _expect(c, "done")
        for c in children:
            _send(c, "verify")   # all four read the finished store at once
        results = [_finish(c) for c in children]
    finally:
        _cleanup(children)

    want = {str(g): group_value(g, 3) for g in range(n)}
    total_ran = 0
    for r in results:
        assert r["first"]["values"] == want
        assert r["again"] == want
        # the second runtime of every process took everything from the store
        assert r["ran_again"] == 0
        assert r["stats_again"]["store_hits"] == n * (PARTS + 1)   # groups and their parts
        total_ran += r["first"]["ran"]
    # every instance ran somewhere, and none ran more than once per process
    assert n * (PARTS + 1) <= total_ran <= 4 * n * (PARTS + 1)

    recs = _stored(store)
    assert all(rec is not None for _k, rec in recs)
    # one entry per instance (the same dependencies give the same trace: first writer wins)
    assert len(recs) == n * (PARTS + 1)
    labels = sorted(rec["label"] for _k, rec in recs)
    assert len(set(labels)) == len(labels)
    for _k, rec in recs:
        if rec["label"].startswith("group("):
            (g,) = decode(rec["args"])
            assert decode(rec["val"]) == group_value(g, 3)


@pytest.mark.slow
@pytest.mark.hang_limit(240)
def test_readers_never_see_half_a_commit(tmp_path):
    store = tmp_path / "store"
    donefile = tmp_path / "writers-done"
    n = 60
    Store(store).close()   # create it, so that the scanners have something to open
    writers = [_spawn("groups", store, seed, n) for seed in (11, 12)]
    scanners = [_spawn("scan", store, donefile, n) for _ in range(2)]
    try:
        for c in writers + scanners:
            _expect(c, "ready")   # scanners: after their first scan, so they scan during writes
        for w in writers:
            _send(w, "go")
        for w in writers:
            _expect(w, "done")
        donefile.write_text("done")
        scans = [_finish(s) for s in scanners]
        for w in writers:
            _send(w, "verify")
        results = [_finish(w) for w in writers]
    finally:
        _cleanup(writers + scanners)

    for s in scans:
        assert s["partial"] == [], s["partial"]
        assert s["missing"] == []
        assert s["scans"] >= 2, s
    want = {str(g): group_value(g, 3) for g in range(n)}
    for r in results:
        assert r["first"]["values"] == want and r["again"] == want
        assert r["ran_again"] == 0


@pytest.mark.slow
@pytest.mark.hang_limit(300)
def test_map_grows_under_load(tmp_path):
    store = tmp_path / "store"
    total = 200                          # 200 x 1 MiB: several times the initial map
    assert total * len(big_value(0)) > 2 * INITIAL_MAP
    # a runtime opened before the growth, which reads only afterwards
    holder = _spawn("big", store, 4, 0, total)
    children = []
    try:
        _expect(holder, "ready")
        # two writers over overlapping ranges, at once: both grow the map while the other uses it
        children = [_spawn("big", store, 1, 0, 130), _spawn("big", store, 2, 70, total)]
        for c in children:
            _expect(c, "ready")
        for c in children:
            _send(c, "go")
        results = [_finish(c, timeout=200) for c in children]
        _send(holder, "go")
        held = _finish(holder, timeout=200)
    finally:
        _cleanup(children + [holder])
    for r in results:
        for i, d in r["digests"].items():
            assert d == hashlib.sha256(big_value(int(i))).hexdigest(), i
    assert sum(r["ran"] for r in results) >= total

    # a new process, and the runtime that was open all along, read every value back without
    # running anything
    reader = _spawn("big", store, 3, 0, total)
    try:
        _expect(reader, "ready")
        _send(reader, "go")
        fresh = _finish(reader, timeout=200)
    finally:
        _cleanup([reader])
    for res in (fresh, held):
        assert res["ran"] == 0
        assert res["stats"]["store_hits"] == total
        assert len(res["digests"]) == total
        for i, d in res["digests"].items():
            assert d == hashlib.sha256(big_value(int(i))).hexdigest(), i

    recs = _stored(store)
    assert len(recs) == total and all(rec is not None for _k, rec in recs)
    assert os.path.getsize(store / "data.mdb") > INITIAL_MAP


@pytest.mark.slow
@pytest.mark.hang_limit(300)
def test_open_store_lists_records_after_another_process_grew_the_map(tmp_path):
    # Store.iter_records (what inspect and gc read) on a Store opened before another process
    # grew the map past its size
    store = tmp_path / "store"
    n = 80                               # 80 MiB > the 64 MiB initial map
    holder = _spawn("holdstore", store)
    writer = None
    try:
        _expect(holder, "ready")
        writer = _spawn("big", store, 5, 0, n)
        _expect(writer, "ready")
        _send(writer, "go")
        wrote = _finish(writer, timeout=200)
        assert wrote["ran"] == n
        _send(holder, "go")
        listed = _finish(holder)
    finally:
        _cleanup([holder] + ([writer] if writer else []))
    assert listed["error"] is None, listed["error"]
    assert listed["count"] == n and listed["damaged"] == 0
