"""Attacks the store's bytes: a damaged record must be a miss plus a DamagedRecordWarning, never
a wrong value, and never a crash.

- Records in the file: random bytes of random records are flipped where they lie in
  ``data.mdb`` (in a leaf page or in overflow pages, every copy of them), as a bad disk would.
  Every damaged record met must warn and be recomputed; every value must be from-scratch.
- Anywhere in the file: random bytes of ``data.mdb`` are flipped, wherever they fall (LMDB's own
  pages included). The reader must end with from-scratch values, or with ``incr.StoreError``;
  never a wrong value, another exception or a signal.
- Crafted records, written through the store API (``Store.delete``/``put``/``commit``): values
  that do not decode, layouts that are wrong under a correct header and checksum, wrong format
  or kind bytes, hostile nesting. Each is a miss plus a warning.

What is not promised (docs/reliability.md): a *sound* record written by someone who can write
the store is taken as it is, whatever the hash.

The cells live in tests/chaos/progs/damage_child.py, which each check runs in a new process.
"""

from __future__ import annotations

import os
import random
import shutil

import lmdb
import msgpack
import pytest

from chaos_util import chaos, finish, spawn  # noqa: F401 - chaos is a fixture
from incr import keys
from incr.store import HEADER, Store, pack_record, unpack_record

pytestmark = pytest.mark.hang_limit(300)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "store"
    res = finish(spawn("damage_child.py", "build", path), timeout=60)
    assert res["wrong"] == [] and res["other"] is None and res["store_error"] is None, res
    return path


def entries(path):
    """{key: raw record} of every entry."""
    env = lmdb.open(os.fspath(path), max_dbs=8, readonly=True, lock=False)
    try:
        db = env.open_db(b"entries", create=False)
        with env.begin(db=db) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def copy_of(pristine, tmp_path, n):
    path = tmp_path / f"store{n}"
    shutil.copytree(pristine, path)
    return path


def check(path):
    return finish(spawn("damage_child.py", "check", path), timeout=60)


def label_of(record):
    return unpack_record(record)["label"]


def test_flipped_record_bytes_in_the_file(pristine, tmp_path, chaos):
    rng = random.Random(31)
    recs = entries(pristine)
    assert len(recs) == 13
    problems = []
    for n in chaos.rounds(20, 20):
        path = copy_of(pristine, tmp_path, n)
        data = bytearray((path / "data.mdb").read_bytes())
        hit = rng.sample(sorted(recs), rng.randint(1, 4))
        for key in hit:
            raw = recs[key]
            edits = [(rng.randrange(len(raw)), rng.randrange(1, 256))
                     for _ in range(rng.randint(1, 3))]
            at = data.find(raw)
            assert at >= 0, "a record is not where LMDB keeps it, in one piece"
            while at >= 0:                        # every copy (old pages may hold one too)
                for off, x in edits:
                    data[at + off] ^= x
                at = data.find(raw, at + 1)
        (path / "data.mdb").write_bytes(bytes(data))
        chaos.count("records_damaged", len(hit))
        res = check(path)
        chaos.count("wrong_values", len(res["wrong"]))
        chaos.count("damaged_warnings", len(res["damaged"]))
        labels = {label_of(recs[k]) for k in hit}
        unwarned = [k.hex()[:16] for k in hit if not any(k.hex()[:16] in m for m in res["damaged"])]
        if (res["wrong"] or res["other"] or res["store_error"] or unwarned
                or not labels <= set(res["ran"])):
            problems.append({"damaged": sorted(labels), "unwarned": unwarned,
                             **{k: res[k] for k in ("wrong", "other", "store_error", "ran")}})
        shutil.rmtree(path)
    assert problems == [], problems


def test_flipped_bytes_anywhere_in_the_file(pristine, tmp_path, chaos):
    rng = random.Random(32)
    problems = []
    for n in chaos.rounds(25, 20):
        path = copy_of(pristine, tmp_path, n)
        data = bytearray((path / "data.mdb").read_bytes())
        flips = rng.randint(1, 8)
        for _ in range(flips):
            data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        (path / "data.mdb").write_bytes(bytes(data))
        chaos.count("bytes_flipped", flips)
        child = spawn("damage_child.py", "check", path)
        try:
            res = finish(child, timeout=60)
        except AssertionError as e:          # a crash: the signal, and where
            problems.append(str(e)[:1500])
            chaos.count("crashes")
            continue
        chaos.count("wrong_values", len(res["wrong"]))
        chaos.count("store_errors", res["store_error"] is not None)
        chaos.count("damaged_warnings", len(res["damaged"]))
        if res["wrong"] or res["other"]:
            problems.append({k: res[k] for k in ("wrong", "other")})
        shutil.rmtree(path)
    assert problems == [], problems


# -- crafted records ------------------------------------------------------------------------------

def _resealed(b):
    """``b`` with its header's length and checksum made right again."""
    body = bytes(b[HEADER.size:])
    magic, fmt, kind, _n, _c = HEADER.unpack(bytes(b[:HEADER.size]))
    return HEADER.pack(magic, fmt, kind, len(body), keys.checksum(body)) + body


def _blob_at(raw, blob):
    at = raw.find(len(blob).to_bytes(4, "big") + blob, HEADER.size)
    assert at > 0
    return at


def _set_byte(i, v):
    def craft(raw, rec):
        b = bytearray(raw)
        b[i] = v
        return bytes(b)
    return craft


CRAFTS = {
    # a sound layout whose value does not decode
    "value_not_msgpack": lambda raw, rec: pack_record(dict(rec, val=b"\xc1")),
    "value_unknown_extension": lambda raw, rec: pack_record(
        dict(rec, val=msgpack.packb(msgpack.ExtType(99, b"x")))),
    "value_nested_too_deep": lambda raw, rec: pack_record(
        dict(rec, val=b"\x91" * 100_000 + b"\xc0")),
    "value_trailing_bytes": lambda raw, rec: pack_record(dict(rec, val=rec["val"] + b"\xc0")),
    "value_int_map_key": lambda raw, rec: pack_record(dict(rec, val=msgpack.packb({1: 2}))),
    # a wrong layout under a right header and checksum
    "trailing_byte": lambda raw, rec: _resealed(raw + b"\x00"),
    "truncated": lambda raw, rec: _resealed(raw[:-3]),
    "value_length_huge": lambda raw, rec: _resealed(
        raw[:_blob_at(raw, rec["val"])] + b"\xff\xff\xff\xf0"
        + raw[_blob_at(raw, rec["val"]) + 4:]),
    "label_not_utf8": lambda raw, rec: _resealed(
        raw.replace(rec["label"].encode(), b"\xff" + rec["label"].encode()[1:], 1)),
    "string_count_huge": lambda raw, rec: _resealed(
        raw[:HEADER.size + 8] + b"\x7f\xff\xff\xff" + raw[HEADER.size + 12:]),
    # the header itself
    "format_byte": _set_byte(2, 9),
    "kind_byte": _set_byte(3, 7),
    "magic": _set_byte(0, ord("x")),
    "empty": lambda raw, rec: b"",
}


def craft_store(path, crafted):
    """Replace entries through the store API: {key: new bytes}."""
    s = Store(path, count_run=False)
    try:
        s.delete(sorted(crafted))
        for k, v in crafted.items():
            s.put(k, v)
        s.commit()
    finally:
        s.close()


def test_crafted_records_through_the_store_api(pristine, tmp_path, chaos):
    rng = random.Random(33)
    recs = entries(pristine)
    kinds = sorted(CRAFTS)
    problems = []
    for n in chaos.rounds(len(kinds) * 2, 20):
        path = copy_of(pristine, tmp_path, n)
        picked = rng.sample(sorted(recs), rng.randint(1, 3))
        crafted = {}
        how = {}
        for i, key in enumerate(picked):
            kind = kinds[(n + i) % len(kinds)]
            crafted[key] = CRAFTS[kind](recs[key], unpack_record(recs[key]))
            how[label_of(recs[key])] = kind
        craft_store(path, crafted)
        chaos.count("records_crafted", len(crafted))
        res = check(path)
        chaos.count("wrong_values", len(res["wrong"]))
        chaos.count("damaged_warnings", len(res["damaged"]))
        if (res["wrong"] or res["other"] or res["store_error"]
                or len(res["damaged"]) < len(crafted) or not set(how) <= set(res["ran"])):
            problems.append({"crafted": how, "warnings": len(res["damaged"]),
                             **{k: res[k] for k in ("wrong", "other", "store_error", "ran")}})
        shutil.rmtree(path)
    assert problems == [], problems
