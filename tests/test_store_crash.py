"""Crash safety: a process killed with SIGKILL at any moment — while importing, opening the store,
computing, or in the middle of a commit — leaves a store that opens, whose every record decodes
and holds the right value, and from which a new process gets the values a from-scratch run gives.

The child (tests/store_progs/crash_child.py) commits one top-level demand at a time and prints a
line after each commit; the parent waits for a seeded random number of lines (so the kill lands
after real progress, not on a timer), adds a seeded random delay of a few milliseconds, and kills.
What is checked does not depend on where the kill landed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import lmdb
import lmdb.verify
import pytest

from incr.keys import decode
from incr.store import FORMAT, Store, unpack_record
from store_progs.crash_model import PARTS, part_value, work_value

PROGS = os.path.join(os.path.dirname(__file__), "store_progs")
CHILD = os.path.join(PROGS, "crash_child.py")
ROUNDS = 30


def _spawn(store, salt, *args):
    return subprocess.Popen(
        [sys.executable, CHILD, os.fspath(store), str(salt), *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROGS)


def _check_store(store):
    """Every record decodes and holds the value the model gives for its arguments and salt.
    Returns {salt: set of i whose work(i) is stored}."""
    problems = lmdb.verify.verify(os.fspath(store))  # LMDB's own offline check of the file
    assert problems == [], problems
    env = lmdb.open(os.fspath(store), max_dbs=4)
    try:
        st = env.stat()
        assert st["psize"] > 0
        entries = env.open_db(b"entries", create=False)
        meta = env.open_db(b"meta", create=False)
        with env.begin() as txn:
            n_entries = txn.stat(entries)["entries"]
            assert txn.get(b"format", db=meta) == str(FORMAT).encode()
            raw = list(txn.cursor(db=entries))
        for _k, v in raw:
            unpack_record(v)   # raises ValueError on a damaged record
    finally:
        env.close()

    stored = {}
    s = Store(store)
    try:
        seen = 0
        for key, rec, size in s.iter_records():
            seen += 1
            assert rec is not None, f"record {key.hex()} does not decode after a crash"
            args = decode(rec["args"])
            val = decode(rec["val"])
            if rec["label"].startswith("work("):
                (i,) = args
                salt = val[1]
                assert val == work_value(i, salt), rec["label"]
                stored.setdefault(salt, set()).add(i)
            else:
                assert rec["label"].startswith("part(")
                i, j = args
                assert val == part_value(i, j, val[2]), rec["label"]
        assert seen == n_entries
    finally:
        s.close()
    return stored


@pytest.mark.slow
@pytest.mark.hang_limit(240)
def test_sigkill_loop_leaves_a_sound_store(tmp_path):
    rng = random.Random(20240517)
    store = tmp_path / "store"
    t0 = time.monotonic()
    progressed = 0
    for round_ in range(ROUNDS):
        salt = rng.choice([0, 1, 2])
        start = rng.randrange(0, 150)
        wait_lines = rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 20, 30])
        child = _spawn(store, salt, start)
        try:
            got = 0
            if wait_lines:
                line = child.stdout.readline()          # "open": the store is open
                assert line == "open\n", (line, child.stderr.read() if not line else "")
            while got < wait_lines:
                line = child.stdout.readline()
                if not line:
                    raise AssertionError(f"child ended early: {child.wait()}\n"
                                         f"{child.stderr.read()}")
                got += 1
            progressed += got
            time.sleep(rng.uniform(0, 0.008))   # where the kill lands; nothing waits on it
            child.send_signal(signal.SIGKILL)
            rc = child.wait(timeout=30)
            assert rc in (-signal.SIGKILL, 0), (rc, child.stderr.read())
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
        if round_ % 10 == 9:
            _check_store(store)   # also sound in the middle of the series
    assert progressed > ROUNDS   # the children did commit work between kills
    assert time.monotonic() - t0 < 60

    stored = _check_store(store)
    assert sum(len(v) for v in stored.values()) > 0
    # a new process gets what a from-scratch run gives, taking the stored work from the store
    for salt in (0, 1, 2):
        have = sorted(stored.get(salt, ()))
        idx = have[:40] + [1000, 1001]   # stored ones, and two never computed
        child = _spawn(store, salt, "--verify", *idx)
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        res = json.loads(out.strip().splitlines()[-1])
        for i in idx:
            assert res["values"][str(i)] == json.loads(json.dumps(work_value(i, salt))), i
        assert res["stats"]["store_hits"] >= len(have[:40])
        # only the two new ones ran: each is work(i) plus its parts
        assert res["ran"] == 2 * (1 + PARTS)
    _check_store(store)
