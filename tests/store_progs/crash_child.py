"""Child of test_store_crash.py: computes work(i) for i = start, start+1, ... one top-level demand
(one store commit) each, and prints ``i`` after each, until it is killed.

With ``--verify N``: demands work(i) for the N indices given after it and prints one JSON line
with what it found (and exits)."""

from __future__ import annotations

import hashlib
import json
import sys

import incr

from crash_model import PARTS

ran = []


def main():
    store, salt = sys.argv[1], int(sys.argv[2])
    rt = incr.Runtime(store=store, durability="sync")   # one commit per demand (the
    # group-commit version of this loop is test_store_group.py's, with group_child.py)
    s = rt.input("salt", salt)

    @incr.cell
    def part(i, j):
        ran.append(("part", i, j))
        blob = hashlib.sha256(f"{i}/{j}/{s.get()}".encode()).digest() * (1 + (i * 7 + j) % 60)
        return (i, j, s.get(), blob)

    @incr.cell
    def work(i):
        ran.append(("work", i))
        parts = [part(i, j) for j in range(PARTS)]
        h = hashlib.sha256(b"".join(p[3] for p in parts)).hexdigest()
        return (i, s.get(), [len(p[3]) for p in parts], h)

    if sys.argv[3] == "--verify":
        idx = [int(a) for a in sys.argv[4:]]
        with rt:
            vals = {i: list(work(i)) for i in idx}
        out = {"values": vals, "ran": len(ran), "stats": rt.stats()}
        rt.close()
        print(json.dumps(out), flush=True)
        return
    start = int(sys.argv[3])
    print("open", flush=True)
    with rt:
        i = start
        while True:
            work(i)
            print(i, flush=True)
            i += 1


if __name__ == "__main__":
    main()
