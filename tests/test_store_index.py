"""The store's index: finding the stored trace that matches an instance's current dependencies
reads the index nodes along the dependencies it walks (each one B-tree lookup) and one entry,
never the instance's other traces; the index is a guide, never a value: a damaged or forged
node is a miss (plus a DamagedRecordWarning for a damaged one), and the value is recomputed.

No test measures a time: what a lookup reads is counted through the cursor methods the store
hands the runtime (``Store._iops`` and ``Store._ops``)."""

from __future__ import annotations

import gc
import warnings

import lmdb
import pytest

import incr
import incr.store as store_mod
from incr.store import DamagedRecordWarning, Store


@pytest.fixture(autouse=True)
def _collect_dead_cells():
    gc.collect()


class Counting:
    """Wraps the store's cursor methods to count what lookups read."""

    def __init__(self, monkeypatch):
        self.n = {"index": 0, "entry": 0, "scan": 0}
        real = Store.pass_cursor
        me = self

        def pass_cursor(store):
            ops = real(store)
            set_range, key, value, next_ = ops
            iset, ivalue, eset, evalue = store._iops

            def count(name, f):
                def g(*a):
                    me.n[name] += 1
                    return f(*a)
                return g

            store._iops = (count("index", iset), ivalue, count("entry", eset), evalue)
            store._ops = (count("scan", set_range), key, value, count("scan", next_))
            return store._ops

        monkeypatch.setattr(Store, "pass_cursor", pass_cursor)

    def take(self):
        out, self.n = self.n, {"index": 0, "entry": 0, "scan": 0}
        return out


def _history(rt, traces):
    x, f = _cells(rt)
    with rt:
        for v in range(traces):
            x.set(v)
            f()
    return x, f


@pytest.mark.parametrize("traces", [3, 400])
def test_a_lookup_reads_the_same_whatever_the_history(tmp_path, monkeypatch, traces):
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _history(rt, traces)
    rt.close()

    counting = Counting(monkeypatch)
    rt = incr.Runtime(store=path)
    x2, f = _cells(rt, 1)
    with rt:
        assert f() == (7, 2)                 # stored: found
    assert rt.stats()["store_hits"] == 1
    # k, then x: three index nodes (root, after k, after x), one entry, no scan
    assert counting.take() == {"index": 3, "entry": 1, "scan": 0}
    with rt:
        x2.set(traces + 5)                   # never seen: a miss after the same walk
        assert f() == (7, 2 * (traces + 5))
    assert counting.take() == {"index": 3, "entry": 0, "scan": 0}
    rt.close()


def _cells(rt, x0=0):
    x, k = rt.input("x", x0), rt.input("k", 7)

    @incr.cell(version="1")
    def f():
        return (k.get(), x.get() * 2)

    return x, f


def _raw(path):
    return lmdb.open(str(path), max_dbs=8)


def _index_items(path):
    env = _raw(path)
    try:
        db = env.open_db(b"index")
        with env.begin(db=db) as txn:
            return list(txn.cursor())
    finally:
        env.close()


def _put_index(path, items):
    env = _raw(path)
    try:
        db = env.open_db(b"index")
        with env.begin(write=True, db=db) as txn:
            for k, v in items:
                txn.put(k, v)
    finally:
        env.close()


@pytest.mark.parametrize("damage", [b"", b"c\xff\xff\xff\xff", b"i\x00\x00\x00\x05ab",
                                    b"Z\x00\x00\x00\x00", b"i\x00\x00\x00\x02\xff\xfe"])
def test_a_damaged_index_node_is_a_miss_and_is_replaced(tmp_path, damage):
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _history(rt, 3)
    rt.close()
    items = _index_items(path)
    _put_index(path, [(k, damage) for k, _v in items])   # every node damaged
    rt = incr.Runtime(store=path)
    x, f = _cells(rt)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with rt:
            x.set(1)
            assert f() == (7, 2)
    assert rt.stats()["computed"] == 1 and rt.stats()["store_hits"] == 0
    assert any(issubclass(m.category, DamagedRecordWarning) and "index" in str(m.message)
               for m in w), [str(m.message) for m in w]
    rt.close()
    rt = incr.Runtime(store=path)           # written again: found
    x, f = _cells(rt)
    with rt:
        x.set(1)
        assert f() == (7, 2)
    assert rt.stats()["store_hits"] == 1 and rt.stats()["computed"] == 0
    rt.close()


def test_a_forged_index_never_yields_a_wrong_value(tmp_path):
    """Every node's items replaced by those of other nodes (entries of other values, and of
    another instance): every lookup ends in a record whose dependencies disagree, or nowhere."""
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    x, _f = _history(rt, 6)
    y = rt.input("y", 0)

    @incr.cell(version="1")
    def g():
        return y.get() + 100

    with rt:
        g()
    rt.close()
    items = _index_items(path)
    values = [v for _k, v in items]
    forged = [(k, values[(i + 1) % len(values)] + values[(i + 3) % len(values)])
              for i, (k, _v) in enumerate(items)]
    _put_index(path, forged)
    rt = incr.Runtime(store=path)
    x, f = _cells(rt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedRecordWarning)
        with rt:
            for v in [0, 3, 5, 1, 4, 2, 9]:
                x.set(v)
                assert f() == (7, 2 * v)
    rt.close()


def test_an_older_format_is_emptied_and_recomputed(tmp_path):
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _history(rt, 2)
    rt.close()
    env = _raw(path)
    try:
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            txn.put(b"format", b"2")
    finally:
        env.close()
    with pytest.warns(DamagedRecordWarning, match="format 2"):
        rt = incr.Runtime(store=path)
    x, f = _cells(rt)
    with rt:
        x.set(1)
        assert f() == (7, 2)
    assert rt.stats()["computed"] == 1 and rt.stats()["store_hits"] == 0
    rt.close()
    env = _raw(path)
    try:
        with env.begin(db=env.open_db(b"meta")) as txn:
            assert txn.get(b"format") == str(store_mod.FORMAT).encode()
    finally:
        env.close()


def test_gc_rebuilds_the_index(tmp_path):
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _history(rt, 20)
    rt.close()
    rt = incr.Runtime(store=path)
    x, f = _cells(rt)
    with rt:
        x.set(3)
        assert f() == (7, 6)
    rt.close()
    before = len(_index_items(path))
    s = Store(path, count_run=False, create=False)
    try:
        res = store_mod.collect(s, keep_runs=1)
    finally:
        s.close()
    assert res["kept"] == 1 and res["dropped"] == 19
    after = _index_items(path)
    assert len(after) == 3 < before            # root, after k, after x=3: one path left
    rt = incr.Runtime(store=path)
    x, f = _cells(rt)
    with rt:
        x.set(3)
        assert f() == (7, 6)
        x.set(4)
        assert f() == (7, 8)
    st = rt.stats()
    assert st["store_hits"] == 1 and st["store_misses"] == 1 and st["recomputed"] == 1
    rt.close()


def test_an_index_node_keeps_the_latest_alternatives_first(tmp_path):
    """After a dependency's code changes, the node before it holds both identities, the
    latest first; a lookup takes the one that names a live cell (test_store_reuse's
    function-edit tests run this across processes)."""
    merge = store_mod._index_merge
    a, b, c = b"i\x00\x00\x00\x01a", b"i\x00\x00\x00\x01b", b"E\x00\x00\x00\x02zz"
    assert merge(None, [a]) == a
    assert merge(a, [b]) == b + a
    assert merge(b + a, [a]) == a + b
    assert merge(a, [b, c]) == c + b + a
    assert merge(b"garbage", [a]) == a                   # a damaged value is replaced
    many = [b"i\x00\x00\x00\x01" + bytes([48 + i]) for i in range(12)]
    assert store_mod._index_items(merge(None, many)) == many[::-1][:store_mod.INDEX_ITEMS]
