"""Child of test_store_concurrency.py. Modes (argv: mode store seed ...):

``groups STORE SEED NGROUPS``: prints ``ready`` once its store is open, waits for ``go`` on
stdin, demands group(g) for every g in a seeded shuffled order (one top-level demand, so one
commit, each), closes its runtime and prints ``done``; then waits for ``verify`` on stdin, opens
a new runtime on the same store, demands every group again and prints one JSON line.

``scan STORE DONEFILE NGROUPS``: reads the store in a loop (``ready`` after the first scan), one read transaction per scan, and
checks that each group's records are all there or none are (a commit is all or nothing), until
DONEFILE exists; then one last scan must find every group. Prints one JSON line.

``big STORE SEED LO HI``: waits for ``go``, demands big(i) (1 MiB of bytes) for i in [LO, HI) in a
seeded shuffled order, prints one JSON line. Its runtime is open from before ``ready``: a child
sent ``go`` late has held its store open while others wrote.

``holdstore STORE``: opens a Store, reports ``ready``, waits for ``go``, then lists every record
with Store.iter_records and prints one JSON line (the count, or the error it met).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

import incr
from incr.keys import decode
from incr.store import Store

PARTS = 10
ran = []


def part_value(g, j, k):
    return {"g": g, "j": j, "k": k, "blob": hashlib.sha256(f"{g}.{j}.{k}".encode()).digest() * 40}


def group_value(g, k):
    return [g, k, sum(part_value(g, j, k)["blob"][0] for j in range(PARTS))]


def big_value(i):
    return hashlib.sha256(str(i).encode()).digest() * (1 << 15)   # 1 MiB


def make_cells(rt):
    k = rt.input("k", 3)

    @incr.cell
    def part(g, j):
        ran.append(("part", g, j))
        return {"g": g, "j": j, "k": k.get(),
                "blob": hashlib.sha256(f"{g}.{j}.{k.get()}".encode()).digest() * 40}

    @incr.cell
    def group(g):
        ran.append(("group", g))
        return [g, k.get(), sum(part(g, j)["blob"][0] for j in range(PARTS))]

    @incr.cell
    def big(i):
        ran.append(("big", i))
        return hashlib.sha256(str(i).encode()).digest() * (1 << 15)

    return group, big


def wait_for(word):
    line = sys.stdin.readline()
    if line.strip() != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


def groups(store, seed, n):
    rt = incr.Runtime(store=store)
    group, _big = make_cells(rt)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    print("ready", flush=True)
    wait_for("go")
    vals = {}
    with rt:
        for g in order:
            vals[g] = group(g)
        # and again, in memory
        for g in order:
            assert group(g) == vals[g]
    first = {"values": vals, "ran": len(ran), "stats": rt.stats()}
    rt.close()
    print("done", flush=True)
    wait_for("verify")
    ran.clear()
    rt = incr.Runtime(store=store)
    group, _big = make_cells(rt)
    with rt:
        again = {g: group(g) for g in order}
    out = {"first": first, "again": again, "ran_again": len(ran), "stats_again": rt.stats()}
    rt.close()
    print(json.dumps(out), flush=True)


def scan(store, donefile, n):
    s = Store(store)
    scans = 0
    partial = []
    max_complete = 0
    try:
        while True:
            finished = os.path.exists(donefile)   # looked at before the scan it decides on
            count = {}
            for key, rec, size in s.iter_records():
                if rec is None:
                    partial.append(["damaged", key.hex()])
                    continue
                args = decode(rec["args"])
                count[args[0]] = count.get(args[0], 0) + 1
            scans += 1
            if scans == 1:
                print("ready", flush=True)
            bad = {g: c for g, c in count.items() if c != PARTS + 1}
            if bad:
                partial.append(["partial", scans, bad])
            max_complete = max(max_complete, len(count))
            if finished:
                missing = sorted(set(range(n)) - set(count))
                break
    finally:
        s.close()
    print(json.dumps({"scans": scans, "partial": partial[:20], "missing": missing,
                      "max_complete": max_complete}), flush=True)


def bigs(store, seed, lo, hi):
    rt = incr.Runtime(store=store)
    _group, big = make_cells(rt)
    order = list(range(lo, hi))
    random.Random(seed).shuffle(order)
    print("ready", flush=True)
    wait_for("go")
    digests = {}
    with rt:
        for i in order:
            v = big(i)
            digests[i] = hashlib.sha256(v).hexdigest() if v == big_value(i) else "WRONG"
    out = {"digests": digests, "ran": len(ran), "stats": rt.stats()}
    rt.close()
    print(json.dumps(out), flush=True)


def holdstore(store):
    s = Store(store)
    print("ready", flush=True)
    wait_for("go")
    try:
        recs = list(s.iter_records())
        out = {"count": len(recs), "damaged": sum(r is None for _k, r, _n in recs),
               "error": None}
    except Exception as e:
        out = {"count": None, "error": f"{type(e).__module__}.{type(e).__name__}: {e}"}
    s.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "groups":
        groups(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "scan":
        scan(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "holdstore":
        holdstore(sys.argv[2])
    elif mode == "big":
        bigs(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode}")
