"""Damaged and hostile store contents: a damaged record is a miss (the cell runs again and gives
the right value) plus a DamagedRecordWarning, never a wrong value; nothing read from a store is
ever unpickled or executed; the record and key decoders raise only their own error on any bytes.

The store is damaged by opening its LMDB environment directly and changing record bytes.
"""

from __future__ import annotations

import gc
import os
import pickle
import struct
import subprocess
import sys
import warnings

import lmdb
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import incr
from incr import keys
from incr._core import decode_simple, utf8_valid
from incr.store import (FORMAT, HEADER, KIND_CELL, MAGIC, DamagedRecordWarning, pack_record,
                        unpack_record)

# Cells at module level, so that their identity is the same for every runtime in this module.
# What ran goes to RAN; the input they read is looked up in INPUTS (globals are not part of a
# cell's identity).
RAN = []
INPUTS = {}


@incr.cell
def base(i):
    RAN.append(f"base({i})")
    return {"i": i, "x": INPUTS["x"].get(), "pad": "p" * 40, "t": (i, -0.0)}


@incr.cell
def upper(i):
    RAN.append(f"upper({i})")
    b = base(i)
    return [b["x"] + i, (i,), b["t"]]


@incr.cell
def target():
    RAN.append("target()")
    return "the real value"


N = 3


def want_upper(i, x=5):
    return [x + i, (i,), (i, -0.0)]


def _same(a, b):
    # equality that tells -0.0 from 0.0 and tuple from list
    return keys.encode(a) == keys.encode(b)


@pytest.fixture(autouse=True)
def _fresh():
    gc.collect()
    RAN.clear()
    INPUTS.clear()
    yield
    RAN.clear()
    INPUTS.clear()


def run_once(path, x=5):
    """A new runtime on ``path`` demands upper(i) for every i; returns (values, ran, warnings)."""
    rt = incr.Runtime(store=path)
    try:
        INPUTS["x"] = rt.input("x", x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with rt:
                values = [upper(i) for i in range(N)]
        ran = list(RAN)
        RAN.clear()
        rt._check()
    finally:
        rt.close()
    return values, ran, [w for w in caught]


def damage_entries(path, change, which=None):
    """Apply ``change(bytes) -> bytes`` to the value of every entry (or of the keys picked
    by ``which(key, record)``); returns how many were changed."""
    env = lmdb.open(os.fspath(path), max_dbs=4)
    n = 0
    try:
        db = env.open_db(b"entries", create=False)
        with env.begin(write=True, db=db) as txn:
            for k, v in list(txn.cursor()):
                if which is None or which(k, unpack_record(v)):
                    txn.put(k, change(bytes(v)))
                    n += 1
    finally:
        env.close()
    return n


def flip(offset):
    def change(v):
        b = bytearray(v)
        b[offset % len(b)] ^= 0x01
        return bytes(b)
    return change


DAMAGES = {
    "magic": flip(0),
    "magic2": flip(1),
    "format": flip(2),
    "kind": flip(3),
    "length": flip(7),
    "checksum": flip(9),
    "payload_first": flip(16),
    "payload_middle": lambda v: flip(16 + (len(v) - 16) // 2)(v),
    "payload_last": flip(-1),
    "truncated": lambda v: v[:-1],
    "extended": lambda v: v + b"\x00",
    "header_only": lambda v: v[:HEADER.size],
    "short": lambda v: v[:5],
    "empty": lambda v: b"",
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_record_is_a_miss_with_a_warning(tmp_path, damage):
    path = tmp_path / "store"
    values, ran, caught = run_once(path)
    assert all(_same(v, want_upper(i)) for i, v in enumerate(values))
    assert len(ran) == 2 * N
    # damage every record
    assert damage_entries(path, DAMAGES[damage]) == 2 * N

    values, ran, caught = run_once(path)
    assert all(_same(v, want_upper(i)) for i, v in enumerate(values)), values
    assert sorted(ran) == sorted([f"base({i})" for i in range(N)] +
                                 [f"upper({i})" for i in range(N)])
    damaged = [w for w in caught if issubclass(w.category, DamagedRecordWarning)]
    assert damaged, f"no DamagedRecordWarning for damage {damage!r}"
    assert all(str(path) in str(w.message) for w in damaged)
    # one warning per damaged record met, not a flood
    assert len(damaged) <= 2 * N


def test_damage_to_one_record_recomputes_only_what_it_held(tmp_path):
    path = tmp_path / "store"
    run_once(path)
    assert damage_entries(path, flip(20), which=lambda k, rec: rec["label"] == "base(1)") == 1
    values, ran, caught = run_once(path)
    assert all(_same(v, want_upper(i)) for i, v in enumerate(values))
    # upper(1)'s record is sound, but base(1) must be verified first; it runs, and gives the
    # value upper(1)'s record was made from, so upper(1) is still taken from the store
    assert ran == ["base(1)"]
    assert sum(issubclass(w.category, DamagedRecordWarning) for w in caught) == 1


def test_recomputed_value_replaces_a_damaged_record(tmp_path):
    # Not spelled out by the contract, but what a user expects: once a damaged entry has been
    # recomputed, the store holds a sound one again, and later runs neither warn nor recompute.
    path = tmp_path / "store"
    run_once(path)
    damage_entries(path, flip(20))
    _values, ran, caught = run_once(path)
    assert len(ran) == 2 * N and caught
    values, ran, caught = run_once(path)
    assert all(_same(v, want_upper(i)) for i, v in enumerate(values))
    assert ran == [], "the damaged records were kept: every later run recomputes"
    assert [str(w.message) for w in caught] == []


# --- a stored pickle is never executed ------------------------------------------------------

class Boom:
    """Unpickling this creates a file (the marker)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _stored_target(path):
    """Compute target() once on a new store; return (entry key, its record)."""
    _demand_target(path)
    env = lmdb.open(os.fspath(path), max_dbs=4)
    try:
        db = env.open_db(b"entries", create=False)
        with env.begin(db=db) as txn:
            found = [(bytes(k), unpack_record(v)) for k, v in txn.cursor()]
    finally:
        env.close()
    assert [rec["label"] for _k, rec in found] == ["target()"]
    return found[0]


def _put_raw(path, key, value):
    env = lmdb.open(os.fspath(path), max_dbs=4)
    try:
        db = env.open_db(b"entries", create=False)
        with env.begin(write=True, db=db) as txn:
            txn.put(key, value)
    finally:
        env.close()


def _forged(rec, val):
    """``rec`` with another ``val``, and a sound header and checksum."""
    return pack_record(dict(rec, val=val, vh=keys.digest("value", val)))


def _demand_target(path):
    rt = incr.Runtime(store=path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with rt:
                v = target()
    finally:
        rt.close()
    ran = list(RAN)
    RAN.clear()
    return v, ran, caught


def test_forged_record_at_the_computed_key_is_found(tmp_path):
    # control for the pickle test below: a sound record put in place of target()'s entry is
    # taken without running target(), so what the pickle test puts there is read
    path = tmp_path / "store"
    key, rec = _stored_target(path)
    _put_raw(path, key, _forged(rec, keys.encode("from the store")))
    v, ran, caught = _demand_target(path)
    assert v == "from the store" and ran == []


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_stored_pickle_is_never_executed(tmp_path, protocol):
    path = tmp_path / "store"
    marker = tmp_path / "PWNED"
    payload = pickle.dumps(Boom(str(marker)), protocol=protocol)
    # the payload is live: unpickling it does create a file
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Boom(str(probe)), protocol=protocol)).close()
    assert probe.exists()

    key, rec = _stored_target(path)
    _put_raw(path, key, _forged(rec, payload))
    v, ran, caught = _demand_target(path)
    assert not marker.exists(), "a stored pickle was executed"
    assert v == "the real value" and ran == ["target()"]
    assert any(issubclass(w.category, DamagedRecordWarning) for w in caught)

    # and a pickle in place of the whole record
    path2 = tmp_path / "store2"
    key, rec = _stored_target(path2)
    _put_raw(path2, key, payload)
    v, ran, caught = _demand_target(path2)
    assert not marker.exists()
    assert v == "the real value" and ran == ["target()"]
    assert any(issubclass(w.category, DamagedRecordWarning) for w in caught)


# --- fuzzing the decoders -------------------------------------------------------------------

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _valid_record():
    ident = "mod.f@c:0123456789abcdef"
    args = keys.encode((1, "a", (2.5, None)))
    val = keys.encode({"k": [1, (2,), frozenset({3})], "b": b"\x00"})
    g_args = keys.encode((3,))
    deps = [["i", "x", keys.digest("value", keys.encode(1))],
            ["c", ["mod.g@v:1", g_args, keys.instance_key("mod.g@v:1", g_args, "xxh3_128")],
             keys.digest("value", keys.encode("v"))]]
    return pack_record({"cell": ident, "label": "f(1, 'a', (2.5, None))", "args": args,
                        "val": val, "vh": keys.digest("value", val), "deps": deps, "run": 7})


VALID = _valid_record()


def _check_schema(rec):
    assert type(rec) is dict
    for k, t in {"cell": str, "label": str, "args": bytes, "val": bytes, "vh": bytes,
                 "deps": list, "run": int}.items():
        assert type(rec[k]) is t
    assert 0 <= rec["run"] < 2**63
    for d in rec["deps"]:
        assert type(d) is list and len(d) == 3 and type(d[2]) is bytes
        if d[0] == "i":
            assert type(d[1]) is str
        else:
            assert d[0] == "c" and [type(x) for x in d[1]] == [str, bytes, bytes]


def _unpack_ok_or_valueerror(data):
    try:
        rec = unpack_record(data)
    except ValueError:
        return None
    # anything else escaping fails the test; a record that is returned is sound
    _check_schema(rec)
    return rec


def test_valid_record_round_trips():
    rec = unpack_record(VALID)
    assert rec["run"] == 7 and keys.decode(rec["val"])["k"][1] == (2,)


@FUZZ
@given(st.binary(max_size=300))
def test_unpack_record_random_bytes(data):
    _unpack_ok_or_valueerror(data)


@FUZZ
@given(st.binary(max_size=300))
def test_unpack_record_random_body_with_a_sound_header(body):
    # the header and checksum are right: msgpack and the schema check must catch the rest
    _unpack_ok_or_valueerror(HEADER.pack(MAGIC, FORMAT, KIND_CELL, len(body),
                                         keys.checksum(body)) + body)


# (byte 3, the record kind, is left out here: test_damaged_record_is_a_miss_with_a_warning[kind]
# covers it)
_POSITIONS = st.integers(0, len(VALID) - 1).filter(lambda p: p != 3)


@FUZZ
@given(st.lists(st.tuples(_POSITIONS, st.integers(1, 255)), min_size=1, max_size=4),
       st.sampled_from(["flip", "truncate", "insert", "flip_and_fix_checksum"]))
def test_unpack_record_mutations_of_a_valid_record(edits, how):
    b = bytearray(VALID)
    if how == "truncate":
        del b[edits[0][0]:]
    elif how == "insert":
        for pos, byte in edits:
            b.insert(pos, byte)
    else:
        for pos, x in edits:
            b[pos] ^= x
    if how == "flip_and_fix_checksum":
        body = bytes(b[HEADER.size:])
        b[:HEADER.size] = HEADER.pack(MAGIC, FORMAT, KIND_CELL, len(body), keys.checksum(body))
    rec = _unpack_ok_or_valueerror(bytes(b))
    if how in ("flip", "truncate", "insert") and bytes(b) != VALID:
        # without a matching checksum, a changed record is never accepted
        assert rec is None


def _blob(data):
    return len(data).to_bytes(4, "big") + data


# Payloads built field by field from the pieces of the layout (store.py), with lengths, counts
# and indexes that are right, slightly wrong or wild: the reader must refuse every one it does
# not return as a sound record.
_u32 = (st.integers(0, 8) | st.integers(0, 2**32 - 1)).map(lambda n: n.to_bytes(4, "big"))
_piece = st.one_of(
    st.binary(max_size=6).map(_blob),
    st.text(max_size=4).map(lambda t: _blob(t.encode("utf-8", "surrogatepass"))),
    _u32,
    st.sampled_from([b"i", b"c", b"x", b"\x00"]),
    st.integers(0, 2**64 - 1).map(lambda n: n.to_bytes(8, "big")),
    st.binary(max_size=3))


@FUZZ
@given(st.lists(_piece, max_size=16))
def test_unpack_record_structured_payloads(parts):
    body = b"".join(parts)
    _unpack_ok_or_valueerror(HEADER.pack(MAGIC, FORMAT, KIND_CELL, len(body),
                                         keys.checksum(body)) + body)


@FUZZ
@given(st.lists(_piece, max_size=12), st.integers(0, 3), st.integers(0, 3))
def test_unpack_record_sound_prefix_then_anything(parts, nstr, ndeps):
    # a run and a string table that are right, then pieces: deeper into the layout
    strs = [f"s{i}".encode() for i in range(nstr)]
    body = (7).to_bytes(8, "big") + nstr.to_bytes(4, "big") + b"".join(map(_blob, strs))
    body += b"".join(parts)
    _unpack_ok_or_valueerror(HEADER.pack(MAGIC, FORMAT, KIND_CELL, len(body),
                                         keys.checksum(body)) + body)


def _decodes(data):
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@FUZZ
@given(st.binary(max_size=12) | st.text(max_size=6).map(
    lambda t: t.encode("utf-8", "surrogatepass")))
def test_record_strings_are_checked_as_python_decodes_utf8(data):
    # the reader checks strings without decoding them; it must accept exactly what Python's
    # strict decoder accepts (overlong forms, surrogates, > U+10FFFF, truncations refused)
    assert utf8_valid(data) == _decodes(data)


@pytest.mark.parametrize("data", [b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80",
                                  b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xe2\x82",
                                  b"\x80", b"a\xff", "é€𝄞".encode(), b"\x00"])
def test_record_strings_edge_cases(data):
    assert utf8_valid(data) == _decodes(data)


@FUZZ
@given(st.binary(min_size=9, max_size=50))
def test_usage_tag_of_a_hit_is_the_store_s(key):
    from incr._core import add_usage_tag
    from incr.store import usage_tag
    tags = bytearray(b"ab")
    add_usage_tag(tags, key)
    assert bytes(tags) == b"ab" + usage_tag(key)


@FUZZ
@given(st.text(max_size=12), st.binary(max_size=20), st.sampled_from(["xxh3_128", "blake2b"]))
def test_runtime_instance_key_is_keys_instance_key(ident, args, algorithm):
    from incr import _core
    want = keys.instance_key(ident, args, algorithm)
    assert _core.instance_key(ident, args, algorithm) == want   # (the prefix is cached now)
    assert _core.instance_key(ident, args, algorithm) == want


@FUZZ
@given(st.binary(max_size=200) | st.integers(0, 5000).map(lambda n: bytes(range(256)) * (n // 256)
                                                        + bytes(n % 256)))
def test_record_checksum_is_keys_checksum(payload):
    # the reader's own XXH64 against the xxhash package's, at every length class (< 4, < 8,
    # < 32, >= 32 bytes and long runs)
    from incr._core import record_checksum
    assert record_checksum(payload) == keys.checksum(payload)


_text = st.text(max_size=6)
_bin = st.binary(max_size=8)
records = st.fixed_dictionaries({
    "cell": _text, "label": _text, "args": _bin, "val": _bin, "vh": _bin,
    "run": st.integers(0, 2**63 - 1),
    "deps": st.lists(st.one_of(
        st.tuples(st.just("i"), _text, _bin).map(list),
        st.tuples(st.just("c"), st.tuples(_text, _bin, _bin).map(list), _bin).map(list)),
        max_size=4)})


@FUZZ
@given(records)
def test_records_round_trip(rec):
    assert unpack_record(pack_record(rec)) == rec


# keys.decode

def _decode_ok_or_decodeerror(data):
    try:
        return True, keys.decode(data)
    except keys.DecodeError:
        return False, None


@FUZZ
@given(st.binary(max_size=300))
def test_decode_random_bytes(data):
    _decode_ok_or_decodeerror(data)


encodable = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    | st.frozensets(st.none() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=4)
                    | st.tuples(st.integers(-9, 9), st.text(max_size=3)), max_size=4),
    max_leaves=16)


def _agree_with_decode(data):
    took, v = decode_simple(data)
    if took:   # the engine's fast reader took it: keys.decode must give the very same value
        assert keys.encode(keys.decode(data)) == keys.encode(v)
        assert type(keys.decode(data)) is type(v)
    return took


@FUZZ
@given(st.binary(max_size=40))
def test_fast_decoder_agrees_on_random_bytes(data):
    _agree_with_decode(data)


_flat = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() \
    | st.text(max_size=8) | st.binary(max_size=8)


@FUZZ
@given(_flat | st.lists(_flat, max_size=20).map(tuple) | encodable)
def test_fast_decoder_agrees_on_encodings(value):
    data = keys.encode(value)
    took = _agree_with_decode(data)
    if type(value) is tuple and all(type(x) in (type(None), bool, int, float, str, bytes)
                                    for x in value):
        assert took, "a flat tuple is the fast reader's case"


@FUZZ
@given(st.lists(_flat, max_size=6).map(tuple),
       st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=3),
       st.sampled_from(["flip", "truncate", "insert"]))
def test_fast_decoder_agrees_on_mutations(value, edits, how):
    b = bytearray(keys.encode(value))
    for pos, x in edits:
        pos %= len(b)
        if how == "flip":
            b[pos] ^= x
        elif how == "insert":
            b.insert(pos, x)
        else:
            del b[pos:]
            if not b:
                break
    if b:
        _agree_with_decode(bytes(b))


@FUZZ
@given(encodable)
def test_decode_inverts_encode(value):
    data = keys.encode(value)
    assert keys.encode(keys.decode(data)) == data


@FUZZ
@given(encodable, st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1,
                           max_size=3),
       st.sampled_from(["flip", "truncate", "insert"]))
def test_decode_mutations_of_valid_encodings(value, edits, how):
    b = bytearray(keys.encode(value))
    for pos, x in edits:
        pos %= len(b)
        if how == "flip":
            b[pos] ^= x
        elif how == "insert":
            b.insert(pos, x)
        else:
            del b[pos:]
            if not b:
                break
    _decode_ok_or_decodeerror(bytes(b))


def _ext(code, data):
    """msgpack ext 8 with any type code, negative (reserved by msgpack) ones included."""
    return b"\xc7" + bytes([len(data)]) + struct.pack(">b", code) + data


@FUZZ
@given(st.integers(-128, 127), st.binary(max_size=40))
def test_decode_arbitrary_extension(code, data):
    _decode_ok_or_decodeerror(_ext(code, data))
    _decode_ok_or_decodeerror(msgpack.packb([1, "a"])[:1] + _ext(code, data) + b"\xc0")


@pytest.mark.parametrize("data", [
    b"\x91" * 200_000 + b"\xc0",                                       # arrays nested deep
    msgpack.packb(msgpack.ExtType(keys.EXT_INPUT, b"\xff\xfe")),       # input name not UTF-8
    msgpack.packb(msgpack.ExtType(keys.EXT_FROZENSET,
                                  (1).to_bytes(4, "big") + b"\x90")),  # unhashable element
    msgpack.packb(msgpack.ExtType(keys.EXT_FROZENSET, b"\x00\x00\x00\x09\x01")),  # truncated
    msgpack.packb(msgpack.ExtType(keys.EXT_TUPLE, msgpack.packb({"a": 1}))),      # not an array
    msgpack.packb(msgpack.ExtType(keys.EXT_REGISTERED, msgpack.packb(["no.Such", 1]))),
    msgpack.packb(msgpack.ExtType(99, b"")),
    msgpack.packb({1: 2}),
    msgpack.packb([1]) + b"\x00",                                      # trailing bytes
    b"",
], ids=["deep-arrays", "input-utf8", "frozenset-unhashable",
        "frozenset-truncated", "tuple-not-array", "unregistered", "unknown-ext", "int-key",
        "trailing", "empty"])
def test_decode_refuses_bad_encodings(data):
    with pytest.raises(keys.DecodeError):
        keys.decode(data)


@pytest.mark.parametrize("data", [
    _ext(-1, struct.pack(">I", 0)),                            # msgpack's Timestamp
    msgpack.packb({b"key": 1}, use_bin_type=True),             # a bytes map key
], ids=["timestamp-ext", "bytes-map-key"])
def test_decode_accepts_only_the_canonical_types(data):
    # keys.decode: "accepts only these extension codes and str map keys; anything else is an
    # error". A decoded value must be one encode() could have produced.
    try:
        value = keys.decode(data)
    except keys.DecodeError:
        return
    pytest.fail(f"decode returned {value!r} ({type(value).__name__}) instead of raising "
                f"DecodeError")


# Deeply nested tuples are checked in a child process: a crash there must fail one test, not
# end the whole run.
DEEP = """
import sys, msgpack
from incr import keys
mode, depth = sys.argv[1], int(sys.argv[2])
if mode == "encoded":              # a value encode() accepts must decode back to itself
    v = ()
    for _ in range(depth):
        v = (v,)
    try:
        data = keys.encode(v)
    except (TypeError, RecursionError):
        print("refused")   # too deep to encode: such a value is never stored
        sys.exit(0)
    assert keys.decode(data) == v
    print("round-trip")
else:                              # hostile bytes: tuple extensions nested `depth` deep
    data = msgpack.packb([])
    for _ in range(depth):
        data = msgpack.packb(msgpack.ExtType(keys.EXT_TUPLE, b"\\x91" + data))
    try:
        keys.decode(data)
        print("decoded")
    except keys.DecodeError:
        print("DecodeError")
"""


@pytest.mark.parametrize("mode,depth", [("encoded", 100), ("encoded", 250), ("encoded", 400),
                                        ("crafted", 300), ("crafted", 5000)])
def test_decode_of_deeply_nested_tuples_does_not_crash(mode, depth):
    proc = subprocess.run([sys.executable, "-c", DEEP, mode, str(depth)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, (
        f"decode of {depth} nested tuples ({mode}) ended the process with {proc.returncode}"
        f"{' (SIGSEGV)' if proc.returncode == -11 else ''}\n{proc.stderr[-2000:]}")
    assert proc.stdout.strip() in ({"round-trip", "refused"} if mode == "encoded"
                                   else {"decoded", "DecodeError"})


BOUNDARY = """
from incr import keys

def hashable(v):
    try:
        hash(v)
        return True
    except TypeError:
        return False

def nest(depth, kinds):
    v = 0
    for i in range(depth):
        k = kinds[i % len(kinds)]
        v = {"t": lambda v: (v,), "l": lambda v: [v], "d": lambda v: {"a": v},
             "f": lambda v: frozenset([v]) if hashable(v) else (v,),
             }[k](v)
    return v

out = []
for kinds in ["t", "l", "d", "f", "tl", "dtf", "ltd"]:
    for depth in range(1, 140, 3):
        v = nest(depth, kinds)
        try:
            data = keys.encode(v)
        except TypeError:
            continue                     # refused: never stored
        try:
            back = keys.decode(data)
        except keys.DecodeError as e:
            out.append(f"{kinds}/{depth}: encoded but does not decode ({e})")
            continue
        if keys.encode(back) != data:
            out.append(f"{kinds}/{depth}: decodes to another value")
print("|".join(out) or "ok")
"""


def test_whatever_encodes_decodes_at_every_nesting_depth():
    # the codec bounds nesting; what encode() accepts must decode back, near the bound too
    proc = subprocess.run([sys.executable, "-c", BOUNDARY], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"ended with {proc.returncode}\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "ok", proc.stdout.strip().split("|")
