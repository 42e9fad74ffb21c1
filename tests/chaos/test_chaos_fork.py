"""Attacks ``os.fork()`` with a store-backed runtime: the parent forks at random moments (after
a demand, with observed instances queued, inside a batch, after a stabilize); the child uses the
parent's runtime, or a new runtime on the same path, or both, and must compute from-scratch
values, taking what is stored from the store (no warning, no run: a forked child is a new
process, and everything it asks for is stored). The parent must then go on with
correct values, and a fresh runtime must read a sound store.

The child reports through a pipe and always leaves with ``os._exit``; a child killed by a signal
fails the test with the signal's name.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import signal
import time
import traceback
import warnings

import pytest

import incr
import incr.store
from chaos_util import chaos, how_it_ended  # noqa: F401 - chaos is a fixture

pytestmark = pytest.mark.hang_limit(300)

PARTS = 3


def leaf_value(i, salt):
    return hashlib.sha256(f"{i}/{salt}".encode()).digest() * (1 + i % 40)


def agg_value(g, salt):
    ls = [leaf_value(PARTS * g + j, salt) for j in range(PARTS)]
    return (g, salt, hashlib.sha256(b"".join(ls)).hexdigest())


class Model:
    """The cells, on one runtime."""

    def __init__(self, path, salt):
        self.rt = incr.Runtime(store=path)
        self.salt = self.rt.input("salt", salt)
        self.runs = 0
        s = self.salt
        model = self

        @incr.cell(version="fork-1")
        def leaf(i):
            model.runs += 1
            return hashlib.sha256(f"{i}/{s.get()}".encode()).digest() * (1 + i % 40)

        @incr.cell(version="fork-1")
        def agg(g):
            model.runs += 1
            ls = [leaf(PARTS * g + j) for j in range(PARTS)]
            return (g, s.get(), hashlib.sha256(b"".join(ls)).hexdigest())

        self.agg = agg

    def values(self, gs):
        with self.rt:
            return {g: self.agg(g) for g in gs}


def wrong_of(got, salt):
    return [[g, repr(v)[:80]] for g, v in got.items() if v != agg_value(g, salt)]


def child_body(model, path, rng):
    """What the child does with the parent's runtime, or a new one, or the parent's and then
    a new one; returns its report."""
    out = {"wrong": [], "used": [], "ran": 0}
    how = rng.choice(["parent", "new", "both"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how in ("parent", "both"):
            out["used"].append("parent runtime")
            runs0 = model.runs
            salt = model.salt.get() if rng.random() < 0.5 else rng.randrange(5)
            model.salt.set(salt)
            out["wrong"] += wrong_of(model.values(rng.sample(range(12), 4)), salt)
            model.rt.stabilize()
            model.rt._check()
            out["ran"] += model.runs - runs0
        if how == "both":
            model.rt.close()   # (one process opens a store once: close before opening anew)
        if how in ("new", "both"):
            out["used"].append("new runtime")
            salt = rng.randrange(5)
            m2 = Model(path, salt)
            out["wrong"] += wrong_of(m2.values(rng.sample(range(12), 4)), salt)
            m2.rt._check()
            m2.rt.close()
            out["ran"] += m2.runs
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    return out


def fork_and_wait(model, path, rng, timeout=60):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            out = child_body(model, path, rng)
        except BaseException as e:
            out = {"error": f"{type(e).__module__}.{type(e).__name__}: {e}",
                   "trace": traceback.format_exc()[-2000:]}
            code = 3
        try:
            with os.fdopen(w, "w") as f:
                f.write(json.dumps(out))
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()           # EOF when the child exits (or dies)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        time.sleep(0.01)
    rc = os.waitstatus_to_exitcode(status)
    return rc, (json.loads(text) if text else None)


def test_fork_with_a_store_backed_runtime(tmp_path, chaos):
    rng = random.Random(0xF0)
    path = tmp_path / "store"
    for s in range(5):          # everything is stored: a child (a new process) runs nothing
        m = Model(path, s)
        m.values(range(12))
        m.rt.close()
    model = Model(path, 0)
    salt = 0
    model.values(range(6))
    problems = []
    for _ in chaos.rounds(25, 15, "forks"):
        where = rng.choice(["after_demand", "observed_dirty", "in_batch", "after_stabilize"])
        chaos.count(f"fork_{where}")
        obs = None
        if where == "observed_dirty":
            obs = model.rt.observe(model.agg, rng.randrange(12))
            model.rt.stabilize()
            salt = rng.randrange(5)
            model.salt.set(salt)              # obs is queued for the next pass now
        elif where == "after_stabilize":
            model.rt.stabilize()
        elif where == "after_demand":
            model.values(rng.sample(range(12), 2))
        if where == "in_batch":
            with model.rt.batch():
                salt = rng.randrange(5)
                model.salt.set(salt)
                rc, out = fork_and_wait(model, path, rng)
        else:
            rc, out = fork_and_wait(model, path, rng)
        if rc != 0 or out is None or out.get("wrong") or out["warnings"] or out["ran"]:
            problems.append({"fork": where, "ended": how_it_ended(rc), "report": out})
            chaos.count("children_failed")
        else:
            chaos.count("children_ok")
        # the parent goes on, unharmed
        got = model.values(rng.sample(range(12), 4))
        bad = wrong_of(got, salt)
        chaos.count("wrong_values", len(bad) + len((out or {}).get("wrong", [])))
        assert bad == [], f"the parent after a fork ({where}): {bad}"
        if obs is not None:
            model.rt.stabilize()
            assert obs.value == agg_value(obs.value[0], salt)
            obs.stop()
        model.rt._check()
    model.rt.close()
    assert problems == [], problems

    # the store the parent and its children shared is sound, and serves correct values
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(5):
            fresh = Model(path, s)
            assert wrong_of(fresh.values(range(12)), s) == []
            fresh.rt.close()
    assert not [w for w in caught if issubclass(w.category, incr.store.DamagedRecordWarning)]
