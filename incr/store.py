"""LMDB persistence (internal; the one place that knows LMDB).

Layout of a store directory (owner-only: the directory is 0700, the files 0600):

- ``meta``    format version, creation time, run counter;
- ``entries`` one record per (instance, trace): key = instance key + trace hash, value = a
  record (below). Several traces of one instance coexist (change-and-revert finds the old one);
- ``used``    per entry key: hit count and the last run that wrote or hit it (for inspect, gc);
- ``nodes``   per LLM node instance key: its state (candidates, verdict ledger, attempt log),
  a record of kind 2 written by incr.llmnodes, committed in the same transaction as entries.

A record is a 16-byte header — magic ``iR``, format version, kind, payload length (u32, big
endian), xxh3_64 of the payload — then a msgpack payload (a map with str keys, checked against
a schema before use). A record whose header, length, checksum, msgpack or schema is wrong is a
miss plus one :class:`DamagedRecordWarning`: it never yields a value. Nothing here pickles,
marshals or evaluates what it reads.

Writes are buffered by the runtime and committed in one write transaction per top-level demand
or stabilization (``commit``); the first writer of an entry wins (``overwrite=False``), so
processes that compute the same entry end with the same stored value.

Invariants: every committed record decodes; a reader never sees half a commit (LMDB's MVCC).
"""

from __future__ import annotations

import errno
import os
import weakref
import struct
import time
import warnings
from typing import Any, Iterator

import lmdb
import msgpack

from incr.errors import StoreError
from incr.keys import checksum

FORMAT = 1
MAGIC = b"iR"
HEADER = struct.Struct(">2sBBI8s")
MAX_RECORD = 64 << 20             # a record larger than this is damaged by definition
KIND_CELL = 1
KIND_NODE = 2
INITIAL_MAP = 64 << 20
NETWORK_FS = {"nfs", "nfs4", "cifs", "smbfs", "smb3", "9p", "afs", "ceph", "glusterfs",
              "fuse.sshfs", "lustre", "gpfs", "davfs", "ncpfs", "coda"}


USAGE = struct.Struct(">QQ")       # hits, last run that wrote or took the entry


def _usage(v: bytes | None) -> tuple[int, int]:
    if v is None or len(v) != USAGE.size:
        return 0, 0
    return USAGE.unpack(v)


class DamagedRecordWarning(UserWarning):
    """A stored record could not be read (damaged or foreign): it was treated as a miss."""


def pack_record(payload: dict, kind: int = KIND_CELL) -> bytes:
    body = msgpack.packb(payload, use_bin_type=True)
    return HEADER.pack(MAGIC, FORMAT, kind, len(body), checksum(body)) + body


_SCHEMA = {"cell": str, "label": str, "args": bytes, "val": bytes, "vh": bytes,
           "deps": list, "run": int}


def unpack_record(data: bytes) -> dict:
    """Decode and check one record; raise ValueError (only) if it is not a sound record."""
    if len(data) < HEADER.size:
        raise ValueError("shorter than a header")
    magic, fmt, kind, length, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not an incr record")
    if fmt != FORMAT:
        raise ValueError(f"record format {fmt}, this incr reads {FORMAT}")
    if kind != KIND_CELL:
        raise ValueError(f"record kind {kind} is unknown")
    if length > MAX_RECORD or length != len(data) - HEADER.size:
        raise ValueError("length field does not match")
    body = memoryview(data)[HEADER.size:]
    if checksum(body) != crc:
        raise ValueError("checksum mismatch")
    try:
        rec = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True,
                              ext_hook=_no_ext)
    except Exception as e:  # any msgpack failure is damage
        raise ValueError(f"payload: {type(e).__name__}") from None
    if type(rec) is not dict:
        raise ValueError("payload is not a map")
    for k, t in _SCHEMA.items():
        if type(rec.get(k)) is not t:
            raise ValueError(f"field {k!r} missing or not {t.__name__}")
    for d in rec["deps"]:
        if type(d) is not list or len(d) != 3 or type(d[2]) is not bytes:
            raise ValueError("malformed dependency")
        kind, ref = d[0], d[1]
        if kind == "c":
            if type(ref) is not list or len(ref) != 2 or type(ref[0]) is not str \
                    or type(ref[1]) is not bytes:
                raise ValueError("malformed cell dependency")
        elif kind != "i" or type(ref) is not str:
            raise ValueError("malformed input dependency")
    return rec


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"extension type {code} in a record envelope")


def _forget_inherited(env: Any) -> None:
    """In a fork()ed child: release the parent's environment handle without touching the
    parent. mdb_env_close in the child unmaps the child's copy and closes the child's
    descriptors; it clears reader slots only for the child's own pid, and fcntl locks are not
    inherited, so the parent's locks and readers are untouched. py-lmdb must forget the handle
    too, or it refuses to open the same files again in this process."""
    try:
        env.close()
    except Exception:
        pass


_live: "weakref.WeakSet[Store]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # forget every inherited environment at once, so that a child can open any store anew
    # (its own Runtime on the same path, or the parent's Runtime, reopened on first use)
    for s in list(_live):
        env, s.env, s.reader = s.env, None, None
        if env is not None:
            _forget_inherited(env)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _begin(env: lmdb.Environment, **kw: Any) -> lmdb.Transaction:
    """A transaction; adopts a map another process grew (MapResizedError) and retries."""
    for _ in range(5):
        try:
            return env.begin(**kw)
        except lmdb.MapResizedError:
            env.set_mapsize(0)
    return env.begin(**kw)


def _fs_type(path: str) -> str | None:
    """The file-system type holding ``path``, from /proc/mounts (None if unknown)."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    best, fstype = "", None
    real = os.path.realpath(path)
    for m in mounts:
        if len(m) >= 3:
            mnt = m[1].replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, m[2]
    return fstype


class Store:
    """An open LMDB store. One per runtime; reopened transparently after ``fork()``."""

    def __init__(self, path: Any, *, max_bytes: int | None = None, count_run: bool = True,
                 create: bool = True):
        self.path = os.path.abspath(os.fspath(path))
        self.max_bytes = max_bytes
        self.count_run = count_run
        if not create and not os.path.isdir(self.path):
            raise StoreError(f"there is no incr store at {self.path}")
        self.pending: dict[bytes, bytes] = {}
        self.pending_nodes: dict[bytes, bytes] = {}
        self.hits: dict[bytes, int] = {}
        self.reader = None               # a read transaction kept for one pass (end_pass)
        self.damaged: set[bytes] = set() # damaged entries seen: replaced at the next commit
        self._open()

    # -- opening --------------------------------------------------------------------------

    def _open(self) -> None:
        path = self.path
        parent = os.path.dirname(path) or "."
        fs = _fs_type(path if os.path.exists(path) else parent)
        if fs in NETWORK_FS or (fs or "").startswith("fuse.sshfs"):
            raise StoreError(
                f"store {path} is on a network file system ({fs}); LMDB's locks do not work "
                f"there. Put the store on a local disk.")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store directory {path}: {e.strerror}. Choose a "
                             f"writable location.") from None
        if not os.path.isdir(path):
            raise StoreError(f"store path {path} exists and is not a directory")
        try:
            st = os.stat(path)
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.chmod(path, 0o700)
        except OSError:
            pass
        if not os.access(path, os.W_OK):
            raise StoreError(f"store {path} is read-only for this user; incr needs to write "
                             f"its lock and data files there")
        size = INITIAL_MAP
        data = os.path.join(path, "data.mdb")
        if os.path.exists(data):
            size = max(size, os.path.getsize(data) * 2)
        try:
            self.env = lmdb.open(path, map_size=size, max_dbs=8, mode=0o600, subdir=True,
                                 readahead=False, meminit=False, max_readers=256)
        except lmdb.Error as e:
            raise StoreError(f"cannot open store {path}: {e}") from None
        self.pid = os.getpid()
        _live.add(self)
        try:
            self.env.reader_check()
            self.meta = self.env.open_db(b"meta")
            self.entries = self.env.open_db(b"entries")
            self.used = self.env.open_db(b"used")
            self.nodes = self.env.open_db(b"nodes")
            with _begin(self.env, write=True) as txn:
                fmt = txn.get(b"format", db=self.meta)
                if fmt is None:
                    if txn.stat(self.entries)["entries"]:
                        raise StoreError(f"store {path} has entries but no format record")
                    txn.put(b"format", str(FORMAT).encode(), db=self.meta)
                    txn.put(b"created", str(time.time()).encode(), db=self.meta)
                elif fmt != str(FORMAT).encode():
                    raise StoreError(
                        f"store {path} has format {fmt[:20]!r}; this version of incr reads "
                        f"format {FORMAT}. Use another directory, or delete this one.")
                run = int(txn.get(b"runs", b"0", db=self.meta))
                if self.count_run:
                    run += 1
                    txn.put(b"runs", str(run).encode(), db=self.meta)
            self.run = run
        except StoreError:
            self.env.close()
            raise
        except lmdb.Error as e:
            self.env.close()
            raise StoreError(f"cannot use store {path}: {e}") from None
        except ValueError:
            self.env.close()
            raise StoreError(f"store {path} has a damaged meta record") from None

    def _env(self) -> lmdb.Environment:
        if os.getpid() != self.pid:   # an LMDB environment must not cross fork()
            self.pending.clear()
            self.pending_nodes.clear()
            self.hits.clear()
            self.damaged.clear()
            self.reader = None
            if self.env is not None:
                _forget_inherited(self.env)
            self._open()
        return self.env

    def _begin(self, **kw: Any) -> lmdb.Transaction:
        return _begin(self._env(), **kw)

    def close(self) -> None:
        self.end_pass()
        if getattr(self, "env", None) is not None and os.getpid() == self.pid:
            if self.max_bytes is not None and self.count_run:
                try:
                    collect(self, keep_runs=None, max_bytes=self.max_bytes)
                except StoreError:
                    pass
            self.env.close()
        self.env = None

    # -- reading --------------------------------------------------------------------------

    def candidates(self, ikey: bytes) -> list[tuple[bytes, dict]]:
        """The sound records stored for the instance key ``ikey``, most recent run first.

        Uses one read transaction for the whole pass (see ``end_pass``)."""
        env = self.env if self.reader is not None else self._env()
        out = []
        damaged = []
        for _ in range(3):
            try:
                if self.reader is None:
                    self.reader = self._begin(db=self.entries, buffers=False)
                cur = self.reader.cursor()
                if cur.set_range(ikey):
                    for k, v in cur:
                        if not k.startswith(ikey):
                            break
                        try:
                            out.append((k, unpack_record(v)))
                        except ValueError as e:
                            damaged.append((k, str(e)))
                break
            except lmdb.MapResizedError:
                self.end_pass()
                env.set_mapsize(0)
                out.clear()
                damaged.clear()
        for k, why in damaged:
            self.damaged.add(k)
            warnings.warn(
                f"incr store {self.path}: damaged record {k.hex()[:16]}… ignored ({why}); "
                f"the value will be recomputed", DamagedRecordWarning, stacklevel=4)
        if len(out) > 1:
            out.sort(key=lambda kv: -kv[1]["run"])
        return out

    def node(self, ikey: bytes) -> bytes | None:
        """The stored state record of the LLM node instance ``ikey`` (a pending one first)."""
        rec = self.pending_nodes.get(ikey)
        if rec is not None:
            return rec
        with self._begin(db=self.nodes, buffers=False) as txn:
            return txn.get(ikey)

    def put_node(self, ikey: bytes, record: bytes) -> None:
        self.pending_nodes[ikey] = record

    def end_pass(self) -> None:
        """Close the pass's read transaction (before a commit, and at the end of a pass)."""
        if self.reader is not None:
            try:
                self.reader.abort()
            except lmdb.Error:
                pass
            self.reader = None

    def iter_records(self) -> Iterator[tuple[bytes, dict | None, int]]:
        """Every entry: (key, record or None if damaged, size in bytes)."""
        with self._begin(db=self.entries, buffers=False) as txn:
            for k, v in txn.cursor():
                try:
                    rec = unpack_record(v)
                except ValueError:
                    rec = None
                yield k, rec, len(v)

    def iter_nodes(self) -> Iterator[tuple[bytes, bytes]]:
        """Every saved LLM node state: (instance key, raw record)."""
        with self._begin(db=self.nodes, buffers=False) as txn:
            yield from txn.cursor()

    def usage(self) -> dict[bytes, tuple[int, int]]:
        """Entry key -> (hits, last run that wrote or hit it)."""
        out = {}
        with self._begin(db=self.used, buffers=False) as txn:
            for k, v in txn.cursor():
                out[k] = _usage(v)
        return out

    # -- writing --------------------------------------------------------------------------

    def put(self, key: bytes, record: bytes) -> None:
        self.pending[key] = record

    def hit(self, key: bytes) -> None:
        self.hits[key] = self.hits.get(key, 0) + 1

    def commit(self) -> None:
        """Write everything buffered in one transaction. Raises StoreError (buffers dropped,
        earlier commits intact) if the disk is full or the store refuses the write."""
        self.end_pass()
        if not self.pending and not self.hits and not self.damaged and not self.pending_nodes:
            return
        env = self._env()
        pending, hits, damaged = self.pending, self.hits, self.damaged
        nodes = self.pending_nodes
        self.pending, self.hits, self.damaged, self.pending_nodes = {}, {}, set(), {}
        for _attempt in range(8):
            try:
                with env.begin(write=True) as txn:
                    for k in damaged:  # a damaged entry is dropped, so its recomputation lands
                        v = txn.get(k, db=self.entries)
                        if v is not None:
                            try:
                                unpack_record(v)
                            except ValueError:
                                txn.delete(k, db=self.entries)
                    for k in sorted(pending):
                        txn.put(k, pending[k], db=self.entries, overwrite=False)
                    for k in sorted(nodes):   # node states: the latest writer wins
                        txn.put(k, nodes[k], db=self.nodes)
                    touched = set(pending)
                    touched.update(hits)
                    # in key order: one cursor walks the B-tree forward instead of seeking
                    # from the root for every key
                    cur = txn.cursor(db=self.used)
                    run = self.run
                    for k in sorted(touched):
                        old = cur.get(k)
                        cur.put(k, USAGE.pack(_usage(old)[0] + hits.get(k, 0), run))
                return
            except lmdb.MapFullError:
                # grow from a quiescent point: our transaction is aborted, none is open
                env.set_mapsize(env.info()["map_size"] * 2)
            except lmdb.MapResizedError:
                env.set_mapsize(0)
            except lmdb.DiskError as e:
                raise StoreError(f"store {self.path}: the disk refused the write ({e}); "
                                 f"earlier results are intact. Free some space.") from None
            except lmdb.ReadonlyError:
                raise StoreError(f"store {self.path} is read-only") from None
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise StoreError(f"store {self.path}: no space left on the device; earlier "
                                     f"results are intact. Free some space.") from None
                raise StoreError(f"store {self.path}: write failed: {e}") from None
            except lmdb.Error as e:
                if "No space" in str(e) or "MDB_MAP_FULL" in str(e):
                    raise StoreError(f"store {self.path}: no space left for the write; "
                                     f"earlier results are intact. Free some space.") from None
                raise StoreError(f"store {self.path}: write failed: {e}") from None
        raise StoreError(f"store {self.path}: could not grow the map to fit the write")

    def delete(self, keys: list[bytes]) -> int:
        n = 0
        with self._begin(write=True) as txn:
            for k in keys:
                n += bool(txn.delete(k, db=self.entries))
                txn.delete(k, db=self.used)
        return n


# --- what the command line needs: summaries, the trace, garbage collection -------------------


def _ikey_len(key: bytes) -> int:
    return 21 if key[:1] == b"b" else 17      # algorithm byte + digest (blake2b: 20, xxh3: 16)


def instances(store: Store) -> list[dict]:
    """One row per stored instance: cell, label, traces, bytes, hits, last run; damaged counted."""
    usage = store.usage()
    rows: dict[bytes, dict] = {}
    for key, rec, size in store.iter_records():
        ik = key[:_ikey_len(key)]
        row = rows.setdefault(ik, {"key": ik.hex(), "cell": None, "label": None, "traces": 0,
                                   "bytes": 0, "hits": 0, "last_run": 0, "damaged": 0})
        row["bytes"] += size
        hits, last = usage.get(key, (0, 0))
        row["hits"] += hits
        if rec is None:
            row["damaged"] += 1
            continue
        row["traces"] += 1
        row["cell"], row["label"] = rec["cell"], rec["label"]
        row["last_run"] = max(row["last_run"], last, rec["run"])
    return sorted(rows.values(), key=lambda r: (r["label"] or "", r["key"]))


def trace(store: Store) -> tuple[dict, list]:
    """The stored trace: nodes (id -> {label, kind}) and edges (dependency id, reader id),
    using each instance's most recent record."""
    latest: dict[bytes, dict] = {}
    for key, rec, _size in store.iter_records():
        if rec is None:
            continue
        ik = key[:_ikey_len(key)]
        if ik not in latest or rec["run"] >= latest[ik]["run"]:
            latest[ik] = rec
    nodes: dict[str, dict] = {}
    edges: list[tuple[str, str]] = []
    ident_args = {}
    for ik, rec in latest.items():
        nid = "c" + ik.hex()[:16]
        nodes[nid] = {"label": rec["label"], "kind": "cell", "cell": rec["cell"]}
        ident_args[(rec["cell"], rec["args"])] = nid
    for ik, rec in latest.items():
        nid = "c" + ik.hex()[:16]
        for kind, ref, _h in rec["deps"]:
            if kind == "i":
                src = "i" + ref
                nodes.setdefault(src, {"label": ref, "kind": "input"})
            else:
                src = ident_args.get((ref[0], ref[1]))
                if src is None:
                    continue
            edges.append((src, nid))
    return nodes, edges


def collect(store: Store, *, keep_runs: int | None = 1, max_bytes: int | None = None,
            dry_run: bool = False) -> dict:
    """Drop entries not reachable from the latest ``keep_runs`` runs (None: keep all), then
    least recently used ones while the entries take more than ``max_bytes``."""
    usage = store.usage()
    recs: dict[bytes, tuple[dict | None, int]] = {}
    for key, rec, size in store.iter_records():
        recs[key] = (rec, size)
    last_of = {k: max(usage.get(k, (0, 0))[1], (r or {}).get("run", 0)) for k, (r, _) in recs.items()}
    latest = max(last_of.values(), default=0)
    drop: set[bytes] = {k for k, (r, _) in recs.items() if r is None}   # damaged: useless
    if keep_runs is not None:
        roots = [k for k, last in last_of.items() if last > latest - keep_runs and k not in drop]
        by_instance: dict[bytes, list[bytes]] = {}
        for k in recs:
            by_instance.setdefault(k[:_ikey_len(k)], []).append(k)
        keep: set[bytes] = set()
        stack = list(roots)
        from incr.keys import digest, encode
        while stack:
            k = stack.pop()
            if k in keep:
                continue
            keep.add(k)
            rec = recs[k][0]
            algo = "blake2b" if k[:1] == b"b" else "xxh3_128"
            for kind, ref, h in rec["deps"]:
                if kind != "c":
                    continue
                try:
                    ik = digest("cell", encode([ref[0], ref[1]]), algo)
                except Exception:
                    continue
                for k2 in by_instance.get(ik, ()):
                    r2 = recs[k2][0]
                    if r2 is not None and r2["vh"] == h and k2 not in keep:
                        stack.append(k2)
        drop |= set(recs) - keep
    if max_bytes is not None:
        remaining = sorted((k for k in recs if k not in drop),
                           key=lambda k: (last_of[k], usage.get(k, (0, 0))[0]))
        total = sum(recs[k][1] for k in remaining)
        for k in remaining:
            if total <= max_bytes:
                break
            drop.add(k)
            total -= recs[k][1]
    freed = sum(recs[k][1] for k in drop)
    if not dry_run and drop:
        store.delete(sorted(drop))
    return {"entries": len(recs), "dropped": len(drop), "kept": len(recs) - len(drop),
            "bytes_freed": freed, "latest_run": latest}
