"""max_bytes enforced at every commit (LRU): the store stays bounded while a program keeps
making new results, evicts the least recently used first, never what the commit in progress
writes or takes, and an evicted result is computed again, correctly."""

from __future__ import annotations

import json
import os

import incr
from incr.store import _live


def _store(path):
    (s,) = [s for s in list(_live) if s.path == str(path) and not s.closed]
    return s


def _measure(path):
    s = _store(path)
    entries = sum(size for _k, _r, size in s.iter_records())
    with s._txn("measuring") as txn:
        index = txn.stat(s.index)["entries"]
        n = txn.stat(s.entries)["entries"]
    return {"entries": n, "entry_bytes": entries, "index_nodes": index,
            "file": os.path.getsize(os.path.join(path, "data.mdb"))}


def _cells(x, ran):
    @incr.cell(version="1")
    def blob(k):                       # a new instance every step
        ran["blob"].append(k)
        return bytes([k % 256]) * 400

    @incr.cell(version="1")
    def echo():                        # one instance, a new trace every step
        ran["echo"].append(x.get())
        return str(x.get()) * 40

    return blob, echo


def _soak(path, max_bytes, steps, every=50):
    ran = {"blob": [], "echo": []}
    rt = incr.Runtime(store=path, max_bytes=max_bytes)
    x = rt.input("x", -1)
    blob, echo = _cells(x, ran)
    sizes = []
    with rt:
        for k in range(steps):
            assert blob(k) == bytes([k % 256]) * 400
            x.set(k)
            assert echo() == str(k) * 40
            if k % every == every - 1:
                rt._commit()
                sizes.append(_measure(path))
    evicted = _store(path).evicted
    rt.close()
    return rt, blob, echo, ran, sizes, evicted


def test_the_store_stays_bounded_while_a_program_makes_new_results(tmp_path):
    path = str(tmp_path / "s")
    max_bytes = 64_000
    steps = 3000
    _rt, _blob, _echo, ran, sizes, evicted = _soak(path, max_bytes, steps)
    assert ran["blob"] == list(range(steps)) and ran["echo"] == list(range(steps))
    assert evicted > steps                       # it evicted all along (two entries a step)
    for m in sizes:                              # at every commit, not only at close
        assert m["entry_bytes"] <= max_bytes, m
    # flat: over the second half of the soak neither the file (LMDB reuses the pages
    # eviction frees; it settles after its free list has filled) nor the index grows
    half = sizes[len(sizes) // 2:]
    assert max(m["file"] for m in half) <= 1.1 * half[0]["file"], [m["file"] for m in sizes]
    assert max(m["index_nodes"] for m in half) <= 2 * min(m["entries"] for m in half) + 2
    (tmp_path / "soak.json").write_text(json.dumps(sizes))

    # a new process: the latest results are taken, the evicted ones computed again, right
    ran = {"blob": [], "echo": []}
    rt = incr.Runtime(store=path)
    x = rt.input("x", steps - 1)
    blob, echo = _cells(x, ran)                     # the same cells, in "the next process"

    with rt:
        assert echo() == str(steps - 1) * 40 and blob(steps - 1) == bytes([(steps - 1) % 256]) * 400
        assert ran == {"blob": [], "echo": []}
        assert blob(3) == bytes([3]) * 400           # evicted long ago: computed again
        x.set(5)
        assert echo() == "5" * 40
        assert ran == {"blob": [3], "echo": [5]}
    rt.close()


def test_what_a_commit_writes_or_takes_is_never_evicted(tmp_path):
    path = str(tmp_path / "s")
    ran = []

    @incr.cell(version="1")
    def blob(k):
        ran.append(k)
        return bytes([k]) * 500

    rt = incr.Runtime(store=path)                  # run 1: ten entries, unbounded
    with rt:
        for k in range(10):
            blob(k)
    rt.close()
    rt = incr.Runtime(store=path, max_bytes=3_000)  # run 2: far smaller than one commit
    with rt:
        for k in range(10):                        # taken (hits) in one commit: over, kept
            blob(k)
        rt._commit()
        assert {r["label"] for r in _labels(path)} == {f"blob({k})" for k in range(10)}
        for k in range(20, 25):                    # written in the next: 0..9 evicted (LRU)
            blob(k)
        rt._commit()
        kept = {r["label"] for r in _labels(path)}
        assert kept == {f"blob({k})" for k in range(20, 25)}, kept
        assert ran == list(range(10)) + list(range(20, 25))
    rt.close()


def _labels(path):
    from incr.store import instances
    return instances(_store(path))


def test_least_recently_used_goes_first_across_runs(tmp_path):
    path = str(tmp_path / "s")
    ran = []

    @incr.cell(version="1")
    def blob(k):
        ran.append(k)
        return bytes([k]) * 500

    rt = incr.Runtime(store=path)
    with rt:
        for k in range(6):                         # run 1 writes 0..5
            blob(k)
        rt._commit()
        size = _measure(path)["entry_bytes"] / 6
    rt.close()
    rt = incr.Runtime(store=path)
    with rt:
        for k in (0, 1):                           # run 2 takes 0 and 1
            blob(k)
    rt.close()
    rt = incr.Runtime(store=path, max_bytes=int(6.5 * size))  # run 3: one more is over
    with rt:
        blob(6)
        rt._commit()
        kept = {r["label"] for r in _labels(path)}
    rt.close()
    # down to 80% of max_bytes: two of 2..5 (last used in run 1) went; 0 and 1 (taken in
    # run 2) and 6 (this commit) stayed
    assert {"blob(0)", "blob(1)", "blob(6)"} <= kept and len(kept) == 5, kept


def test_llm_node_states_count_in_max_bytes_and_are_evicted_lru(tmp_path):
    """An LLM node's state (incr.llmnodes writes it through Store.put_node) counts in
    max_bytes like an entry, and is evicted by the same LRU order: a state read since is
    kept, one not used since is evicted first."""
    path = str(tmp_path / "s")
    ran = {"blob": [], "echo": []}
    rt = incr.Runtime(store=path, max_bytes=20_000)
    x = rt.input("x", -1)
    blob, _echo = _cells(x, ran)
    s = _store(path)
    a, b = b"x" + b"A" * 16, b"x" + b"B" * 16
    with rt:
        s.put_node(a, b"a" * 8000)
        s.put_node(b, b"b" * 8000)
        rt._commit()
        assert s.node(a) == b"a" * 8000          # a use of a's state
        for k in range(5):
            blob(k)
        rt._commit()
        assert s.evicted_nodes == 0 and s.evicted == 0
        for k in range(5, 10):
            blob(k)
        rt._commit()                             # over max_bytes: b goes first
        assert s.evicted_nodes == 1
        assert s.node(b) is None and s.node(a) == b"a" * 8000
        entries = sum(size for _k, _r, size in s.iter_records())
        nodes = sum(len(v) for _k, v in s.iter_nodes())
        assert nodes == 8000 and entries + nodes <= 20_000
        with s._txn("measuring", db="meta") as txn:
            assert int(txn.get(b"stored_bytes")) == entries + nodes
    rt.close()
    assert ran["blob"] == list(range(10))
