"""The engine's compiled writers (incr/_codec.pyx) produce exactly the bytes of the reference
encoders: an instance key, value hash or trace hash made in place must equal the one
incr.keys / msgpack would make (else a store written before would become all misses, or two
processes would disagree), and a record or index node must have the documented layout.

Each property compares the fast writer with an independent reference (keys.encode,
msgpack.packb, or the layout written out here in Python from incr/store.py's docstring).
"""

from __future__ import annotations

import math
import struct

import msgpack
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from incr import _codec, keys
from incr.store import FORMAT, KIND_CELL, unpack_record

ints = st.one_of(st.integers(-2 ** 63, 2 ** 64 - 1), st.sampled_from(
    [0, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, -32, -33, -128, -129,
     -32768, -32769, -2 ** 31, -2 ** 31 - 1, 2 ** 63 - 1, -2 ** 63]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True),
                    st.text(max_size=300), st.binary(max_size=300),
                    st.sampled_from(["x" * 70_000, b"y" * 70_000, "\ud800", -0.0]))
values = st.one_of(scalars, st.tuples(scalars, scalars),
                   st.lists(scalars, max_size=40).map(tuple),
                   st.lists(scalars, max_size=3), st.tuples(st.tuples(scalars)))


def _reference(v):
    try:
        return keys.encode(v), keys.encode_value(v)
    except TypeError:
        return None, None


@settings(max_examples=400, deadline=None)
@given(values)
def test_encode_simple_is_keys_encode(v):
    fast = _codec.encode_simple(v)
    ref, ref_value = _reference(v)
    if fast is None:
        # not written in place: only what the simple writer does not cover
        simple = (v is None or type(v) in (bool, int, str, bytes)
                  or (type(v) is float and not math.isnan(v)))
        if type(v) is tuple:
            simple = all(x is None or type(x) in (bool, int, str, bytes)
                         or (type(x) is float and not math.isnan(x)) for x in v)
        if simple:   # an int beyond 64 bits signed, or a str that is not UTF-8
            assert any((type(x) is int and not -2 ** 63 <= x < 2 ** 63)
                       or (type(x) is str and _not_utf8(x))
                       for x in (v if type(v) is tuple else (v,)))
        return
    assert fast == ref == ref_value, v


def _not_utf8(s):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def test_encode_simple_edges():
    # the boundaries of each msgpack width, and the extension head sizes of tuples
    for v in [0, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, -1,
              -32, -33, -128, -129, -32768, -32769, -2 ** 31, -2 ** 31 - 1, -2 ** 63,
              "", "a" * 31, "a" * 32, "a" * 255, "a" * 256, "a" * 65535, "a" * 65536,
              b"", b"b" * 255, b"b" * 256, b"b" * 65536, 0.0, -0.0, math.inf, 1e308,
              (), (1,), (1, 2, 3), (1, 2, 3, 4, 5, 6, 7), tuple(range(15)), tuple(range(16)),
              tuple(range(254)), ("s" * 300,), ("s" * 70_000,), tuple(range(70_000))]:
        assert _codec.encode_simple(v) == keys.encode(v), repr(v)[:80]
    for v in [2 ** 63, 2 ** 64, math.nan, (math.nan,), [1], {"a": 1}, ((1,),), frozenset()]:
        assert _codec.encode_simple(v) is None, v


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("i"), st.text(max_size=40), st.binary(min_size=1, max_size=20)),
    st.tuples(st.just("c"), st.text(max_size=40), st.binary(max_size=300),
              st.binary(max_size=20), st.binary(min_size=1, max_size=20))), max_size=20))
def test_trace_bytes_is_msgpack(stored):
    ref = [["i", d[1], d[2]] if d[0] == "i" else ["c", [d[1], d[2]], d[4]] for d in stored]
    try:
        want = msgpack.packb(ref, use_bin_type=True)
    except UnicodeEncodeError:
        assert _codec.trace_bytes(stored) is None
        return
    assert _codec.trace_bytes(stored) == want


@pytest.mark.parametrize("domain", ["value", "trace"])
@pytest.mark.parametrize("algorithm", ["xxh3_128", "blake2b"])
def test_digest_is_keys_digest(domain, algorithm):
    for payload in [b"", b"a", b"x" * 1000]:
        assert _codec.digest(domain, payload, algorithm) == keys.digest(domain, payload,
                                                                        algorithm)


def _blob(b):
    return struct.pack(">I", len(b)) + b


def _layout(ident, label, args, val, vh, deps, run):
    # incr/store.py's record layout, written out independently
    strs = []

    def sid(s):
        if s not in strs:
            strs.append(s)
        return strs.index(s)

    ci, li = sid(ident), sid(label)
    parts = [_blob(args), _blob(val), _blob(vh), struct.pack(">I", len(deps))]
    for d in deps:
        if d[0] == "i":
            parts.append(b"i" + struct.pack(">I", sid(d[1])) + _blob(d[2]))
        else:
            parts.append(b"c" + struct.pack(">I", sid(d[1])) + _blob(d[2]) + _blob(d[3])
                         + _blob(d[4]))
    body = (struct.pack(">QI", run, len(strs)) + b"".join(_blob(s.encode()) for s in strs)
            + struct.pack(">II", ci, li) + b"".join(parts))
    return (b"iR" + bytes((FORMAT, KIND_CELL)) + struct.pack(">I", len(body))
            + xxhash.xxh64_digest(body) + body)


names = st.text(max_size=30).filter(lambda s: not _not_utf8(s))


@settings(max_examples=200, deadline=None)
@given(names, names, st.binary(max_size=100), st.binary(max_size=400), st.binary(max_size=17),
       st.lists(st.one_of(
           st.tuples(st.just("i"), names, st.binary(max_size=17)),
           st.tuples(st.just("c"), names, st.binary(max_size=50), st.binary(max_size=17),
                     st.binary(max_size=17))), max_size=8),
       st.integers(0, 2 ** 63 - 1))
def test_pack_record_layout(ident, label, args, val, vh, deps, run):
    data = _codec.pack_record_fields(ident, label, args, val, vh, deps, run)
    assert data == _layout(ident, label, args, val, vh, deps, run)
    rec = unpack_record(data)
    assert (rec["cell"], rec["label"], rec["args"], rec["val"], rec["vh"], rec["run"]) == (
        ident, label, args, val, vh, run)


def test_index_nodes_layout():
    ikey, entry = b"x" + bytes(range(16)), b"x" + bytes(range(16)) + b"T" * 17
    deps = [["i", "n\u00e9", b"xh1"], ["c", ["m.f@v:1", b"\xd4\x01\x90", b"xik"], b"xh2"]]
    root = bytes(16)
    n1 = xxhash.xxh3_128_digest(root + b"i" + _blob("n\u00e9".encode()) + _blob(b"xh1"))
    n2 = xxhash.xxh3_128_digest(n1 + b"c" + _blob(b"xik") + _blob(b"xh2"))
    assert _codec.index_nodes(ikey, entry, deps) == [
        (ikey + root, b"i" + _blob("n\u00e9".encode())),
        (ikey + n1, b"c" + _blob(b"m.f@v:1") + _blob(b"\xd4\x01\x90") + _blob(b"xik")),
        (ikey + n2, b"E" + _blob(entry))]


def test_a_cells_key_and_hashes_are_keys_own(tmp_path):
    # end to end: what the runtime stores under is what incr.keys computes
    import incr
    rt = incr.Runtime(store=tmp_path / "s")
    x = rt.input("x", 3)

    @incr.cell(version="1")
    def f(i, s):
        return (x.get() + i, s)

    with rt:
        assert f(5, "a") == (8, "a")
    ident = keys.cell_identity(f)
    ik = keys.instance_key(ident, keys.encode((5, "a")), "xxh3_128")
    assert rt._ikey(rt._instance(f, (5, "a"), {}, create=False)) == ik
    rt.close()
    from incr.store import Store
    s = Store(tmp_path / "s", count_run=False)
    try:
        (key, rec, _n), = list(s.iter_records())
    finally:
        s.close()
    assert key[:len(ik)] == ik
    assert rec["val"] == keys.encode_value((8, "a"))
    assert rec["vh"] == keys.digest("value", keys.encode_value((8, "a")))
    xh = keys.digest("value", keys.encode_value(3))
    trace = keys.digest("trace", msgpack.packb([["i", "x", xh]], use_bin_type=True))
    assert key == ik + trace
