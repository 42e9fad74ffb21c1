"""Child of test_chaos_fullfs.py (not collected by pytest).

``fullfs_child.py DIR SEED ROUNDS``: DIR is a small file system of its own (a 2 MiB tmpfs).
Each round, on a clean DIR, either fills the disk first and then opens a store, or opens a
store, commits some values and then fills the disk, leaving a seeded random few KiB free; then
demands values of random sizes. Every demand must return the from-scratch value or raise
``incr.StoreError``; values computed before the disk filled must still be returned; once the
filler is deleted, a new runtime on the store works and reads only correct values. Prints one JSON line with the counts and every problem.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import sys
import warnings

import incr
import incr.store

CHUNK = 16 << 10


def value_of(i, size):
    return hashlib.sha256(str(i).encode()).digest() * (size // 32)


def fill(path, leave):
    """Write ``path`` until the disk is full, then give back ``leave`` bytes."""
    written = 0
    f = open(path, "ab")     # (appends: the disk may be full already from an earlier round)
    try:
        while True:
            try:
                f.write(b"\xa5" * CHUNK)
                f.flush()
                written += CHUNK
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                break
    finally:
        try:
            f.close()        # what the buffer still holds cannot be written either
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
    size = os.path.getsize(path)
    os.truncate(path, max(0, size - leave))


def make(path):
    # "sync": each demand's commit meets the full disk itself (with "group" the interval's
    # commit does, and what waited lands once space is back: test_store_group covers it)
    rt = incr.Runtime(store=path, durability="sync")
    sizes = {}

    @incr.cell(version="1")
    def blob(i):
        return hashlib.sha256(str(i).encode()).digest() * (sizes[i] // 32)

    return rt, blob, sizes


def main():
    root, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    out = {"rounds": 0, "store_errors": 0, "opened_on_full_disk": 0, "open_refused": 0,
           "demands": 0, "wrong": [], "other_errors": [], "damaged_warnings": 0}
    warnings.simplefilter("always")
    for r in range(rounds):
        out["rounds"] += 1
        for name in os.listdir(root):
            p = os.path.join(root, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
        store, filler = os.path.join(root, "store"), os.path.join(root, "filler")
        leave = rng.choice([0, 0, 4096, 16384, 65536, 200000])
        expected = {}          # i -> size of every value returned so far
        rt = None

        def demand(rt, blob, sizes, i, size, must_work=False):
            sizes[i] = size
            out["demands"] += 1
            try:
                with rt:
                    v = blob(i)
            except incr.StoreError:
                out["store_errors"] += 1
                if must_work:
                    out["other_errors"].append(f"round {r}: blob({i}) raised StoreError with "
                                               f"free space / from memory")
                return
            except Exception as e:
                out["other_errors"].append(f"round {r}: blob({i}): "
                                           f"{type(e).__module__}.{type(e).__name__}: {e}")
                return
            if v != value_of(i, size):
                out["wrong"].append([r, i])
            expected[i] = size

        try:
            if rng.random() < 0.5:
                fill(filler, leave)
                try:
                    rt, blob, sizes = make(store)
                    out["opened_on_full_disk"] += 1
                except incr.StoreError:
                    out["open_refused"] += 1
                    continue
            else:
                rt, blob, sizes = make(store)
                for i in range(3):
                    demand(rt, blob, sizes, i, rng.choice([100, 3000, 40000]), must_work=True)
                fill(filler, leave)
                for i in list(expected):   # computed before: still given, from memory
                    demand(rt, blob, sizes, i, expected[i], must_work=True)
            for i in range(10, 10 + rng.randint(2, 6)):
                demand(rt, blob, sizes, i, rng.choice([64, 5000, 60000, 300000]))
            os.unlink(filler)
            # space again: this runtime may still refuse to write (StoreError), never more
            for i in range(20, 23):
                demand(rt, blob, sizes, i, 2000)
            for i in list(expected):
                demand(rt, blob, sizes, i, expected[i], must_work=True)
            rt._check()
            try:
                rt.close()
            except incr.StoreError:
                out["store_errors"] += 1
            # a new runtime on the store: only correct values
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rt, blob, sizes = make(store)
                for i, size in expected.items():
                    demand(rt, blob, sizes, i, size, must_work=True)
                rt.close()
            out["damaged_warnings"] += sum(issubclass(w.category, incr.store.DamagedRecordWarning)
                                           for w in caught)
        except Exception as e:
            out["other_errors"].append(f"round {r}: {type(e).__module__}.{type(e).__name__}: {e}")
        finally:
            if rt is not None and not rt.closed:
                try:
                    rt.close()
                except incr.StoreError:
                    pass
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
