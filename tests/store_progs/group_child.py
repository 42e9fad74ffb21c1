"""Child of test_store_group.py: like crash_child.py, with ``durability="group"`` (the
default): computes work(i) for i = start, start+1, ... one top-level demand each, forever.
Every ``every`` demands it makes what it computed durable (``rt._commit()``) and prints
``durable i`` (work(0..i) of this child is stored); after the other demands it prints ``i``.

With ``--verify``: demands work(i) for the indices given after it and prints one JSON line
with the values, how many functions ran and the runtime's stats (and exits)."""

from __future__ import annotations

import hashlib
import json
import sys

import incr

from crash_model import PARTS

ran = []


def main():
    store, salt = sys.argv[1], int(sys.argv[2])
    rt = incr.Runtime(store=store, durability="group")
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
    start, every = int(sys.argv[3]), int(sys.argv[4])
    print("open", flush=True)
    with rt:
        i = start
        while True:
            work(i)
            if i % every == every - 1:
                rt._commit()
                print(f"durable {i}", flush=True)
            else:
                print(i, flush=True)
            i += 1


if __name__ == "__main__":
    main()
