"""Child of test_chaos_multiprocess.py (not collected by pytest).

``mp_child.py STORE SEED ROUNDS MAP MAX_BYTES``: sets the store's initial map to MAP bytes (so
that the map must grow many times), prints ``ready``, waits for ``go`` on stdin, then for ROUNDS
rounds: sets the input ``salt`` to a seeded random value, demands a seeded random handful of
``agg(g)`` (one top-level demand, so one commit, each) and compares every value with the plain
function; now and then it closes its runtime (with MAX_BYTES > 0, close() trims the store while
the others write) and opens a new one. Prints one JSON line: what it did and every wrong value
or unexpected exception.

``mp_child.py STORE SEED verify NGROUPS``: one runtime, every agg(g) for g < NGROUPS and every
salt; prints the same JSON line.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys

import incr
import incr.store

BLOBS = 4          # blob(4g + j), j < BLOBS, feed agg(g)
NGROUPS = 12
SALTS = (0, 1, 2)
ran = []


def blob_value(i, salt):
    size = 6000 + (i * 7919 + salt * 104729) % 30000
    return hashlib.sha256(f"{i}:{salt}".encode()).digest() * (size // 32)


def agg_value(g, salt):
    blobs = [blob_value(BLOBS * g + j, salt) for j in range(BLOBS)]
    return [g, salt, [len(b) for b in blobs], hashlib.sha256(b"".join(blobs)).hexdigest()]


def make(store, max_bytes):
    rt = incr.Runtime(store=store, max_bytes=max_bytes or None)
    salt = rt.input("salt", 0)

    @incr.cell(version="1")
    def blob(i):
        ran.append(("blob", i))
        s = salt.get()
        size = 6000 + (i * 7919 + s * 104729) % 30000
        return hashlib.sha256(f"{i}:{s}".encode()).digest() * (size // 32)

    @incr.cell(version="1")
    def agg(g):
        ran.append(("agg", g))
        blobs = [blob(BLOBS * g + j) for j in range(BLOBS)]
        return [g, salt.get(), [len(b) for b in blobs],
                hashlib.sha256(b"".join(blobs)).hexdigest()]

    return rt, salt, agg


def main():
    store, seed = sys.argv[1], int(sys.argv[2])
    out = {"demands": 0, "wrong": [], "errors": [], "reopens": 0, "store_hits": 0,
           "store_misses": 0}
    if sys.argv[3] == "verify":
        rt, salt, agg = make(store, 0)
        with rt:
            for s in SALTS:
                salt.set(s)
                for g in range(int(sys.argv[4])):
                    check(out, agg, g, s)
        tally(out, rt)
        rt.close()
        print(json.dumps(out), flush=True)
        return
    rounds, map_bytes, max_bytes = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    incr.store.INITIAL_MAP = map_bytes      # a tiny map: it must grow under load
    rng = random.Random(seed)
    rt, salt, agg = make(store, max_bytes)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected 'go'")
    for _ in range(rounds):
        s = rng.choice(SALTS)
        with rt:
            salt.set(s)
            for g in rng.sample(range(NGROUPS), 4):
                check(out, agg, g, s)
        if rng.random() < 0.15:
            tally(out, rt)
            rt.close()
            out["reopens"] += 1
            rt, salt, agg = make(store, max_bytes)
    tally(out, rt)
    rt.close()
    print(json.dumps(out), flush=True)


def check(out, agg, g, s):
    out["demands"] += 1
    try:
        v = agg(g)
    except Exception as e:   # none is expected: the disk is not full, the store is sound
        out["errors"].append(f"agg({g}) salt {s}: {type(e).__module__}.{type(e).__name__}: {e}")
        return
    if v != agg_value(g, s):
        out["wrong"].append([g, s, repr(v)[:200]])


def tally(out, rt):
    st = rt.stats()
    out["store_hits"] += st["store_hits"]
    out["store_misses"] += st["store_misses"]


if __name__ == "__main__":
    main()
