"""LMDB persistence (internal; the one place that knows LMDB).

Layout of a store directory (a directory incr creates is 0700; the files are 0600; LMDB's
``data.mdb`` and ``lock.mdb``, and ``incr.lock``, which every open Store holds a shared flock on
and ``compact`` an exclusive one):

- ``meta``    format version, creation time, run counter, ``stored_bytes`` (the bytes of the
  entries' records and of the LLM node states: ``max_bytes`` is checked against it at every
  commit, see ``_bound``);
- ``entries`` one record per (instance, trace): key = instance key + trace hash, value = a
  record (below). Several traces of one instance coexist (change-and-revert finds the old one);
- ``log``     usage, as written: one entry per commit that wrote or took entries, key = run
  (u64) + sequence (u32), value = kind (u8: 0 written, 1 taken) + the usage tags of those
  entries, concatenated (a tag is listed once per hit). The *usage tag* of an entry key is 8
  of its bytes, 4 of the instance key and 4 of the trace hash (``usage_tag``): 8 bytes a hit;
- ``used``    usage, folded: per usage tag, hit count and the last run that wrote or hit it.
  The commit that finds ``FOLD_AT`` log entries, or the log at a quarter of the entries' size,
  folds the log into ``used`` (one update per distinct tag); so does ``gc``.
  ``Store.usage()`` reports both, per entry key. Usage is advisory (inspect, gc): two entries
  whose tags collide (about 2**-64 per pair) share it, and a damaged log entry is skipped.
- ``index``   how a lookup finds the entry that matches an instance's current dependencies
  without reading the others (a trie over the dependencies, as read). Key = instance key + a
  16-byte node id; the root is 16 zero bytes, and the node after node N once dependency D read
  a value of hash H is XXH3-128(N | kind | len | ref | len | H), ref being an input's UTF-8
  name or a cell's instance key. Value = up to INDEX_ITEMS items, the latest written first:
  the next dependency the traces through N read, ``b"i"`` + blob(name) or ``b"c"`` +
  blob(identity) + blob(args) + blob(instance key), or, where they read no more, ``b"E"`` +
  blob(entry key). Usually one item; several after a dependency's code was edited (each
  identity its own item: a lookup takes the first that names a live cell) or for a cell that
  reads differently on equal values. Written with each entry; rebuilt by ``incr gc``. A
  lookup walks it, bringing each dependency up to date, then checks the entry's record
  against what it walked: the index is a guide, never a value (a damaged node is a miss plus
  a DamagedRecordWarning, and is replaced when the value is written again);
- ``runs``    per run (u64) that counted itself: the id (u32) of its *program*;
- ``programs`` per program (its command line, ``_program``: the main script's absolute path
  and its arguments, JSON): its id (u32); ``meta`` ``programs`` counts them;
- ``used_by`` usage per program, folded with ``used``: key = usage tag + program id (u32),
  value = the last run (u64) of that program that wrote or took the entry. ``incr gc
  --keep-runs N`` keeps what the latest N runs *of each program* used (not the latest N runs
  of the store: another program's results are not dropped because it ran less recently);
- ``nodes``   per LLM node instance key: its state (candidates, verdict ledger, attempt log),
  a record of kind 2 written by incr.llmnodes, committed in the same transaction as entries.
  Its usage is kept like an entry's, under the tag ``node_tag`` (written, or read by
  ``node``), and ``max_bytes`` counts and evicts it like one.

A record (format 3; its layout is format 2's) is a 16-byte header — magic ``iR``, format version, kind, payload length
(u32), XXH64 of the payload (u64, ``keys.checksum``) — then the payload; every integer is big endian, a *blob*
is a u32 length and that many bytes, a *string* a blob of UTF-8::

    run u64 | string count u32 | strings... | cell u32 | label u32      (string indexes)
    | args blob | val blob | vh blob | dependency count u32 | dependencies...
    dependency: b"i" name u32 | hash blob                                (an input)
              | b"c" identity u32 | args blob | instance key blob | hash blob   (a cell)

The reader (``incr._core``, compiled) checks the header, the length, the checksum and then the
whole layout (lengths and indexes in bounds, strings UTF-8, nothing left over) before anything
is used. A record that fails any check is a miss plus one :class:`DamagedRecordWarning`: it
never yields a value. Nothing here pickles, marshals or evaluates what it reads.

Writes are buffered by the runtime and committed in one write transaction per top-level demand
or stabilization (``commit``); the first writer of an entry wins (``overwrite=False``), so
processes that compute the same entry end with the same stored value.

With ``remote=`` (incr.tiers), a lookup that misses locally asks the remote tier for the index
node, entry or LLM node state under the same key (``_read_through``, ``_fetch``; an
instance's root comes with its *bundle*, ``_prefetch``), checks it (``_check_remote``: as a
local record, and an entry by its content address), and writes it locally at the next commit;
each commit pushes what it wrote (and a bundle per instance) to the remote's write-behind
queue. Nothing read from a remote is trusted before those checks.

Invariants: every committed record decodes; a reader never sees half a commit (LMDB's MVCC);
no thread uses a handle that another thread closed (see ``Store``); a forked child uses only
handles it opened itself.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import gc
import json
import os
import stat
import struct
import threading
import time
import warnings
import weakref
from collections import Counter
from typing import Any, Callable, Iterator

import lmdb

from incr.errors import StoreError

FORMAT = 3                        # of the store and of its records (3: the index)
UPGRADE = {b"2"}                  # formats whose stores are emptied and reused (their entries
                                  # become misses: never a wrong value)
MAGIC = b"iR"
HEADER = struct.Struct(">2sBBI8s")
MAX_RECORD = 64 << 20             # a record larger than this is damaged by definition
KIND_CELL = 1
KIND_NODE = 2
INITIAL_MAP = 64 << 20
MIN_FREE = 1 << 20                # bytes free on its file system to open a store (see _open)
LOCK_FILE = "incr.lock"           # flock: shared by every open Store, exclusive to compact
NETWORK_FS = {"nfs", "nfs4", "cifs", "smbfs", "smb3", "9p", "afs", "ceph", "glusterfs",
              "fuse.sshfs", "lustre", "gpfs", "davfs", "ncpfs", "coda"}


USAGE = struct.Struct(">QQ")       # hits, last run that wrote or took the entry
LOG_KEY = struct.Struct(">QI")    # run, sequence
FOLD_AT = 64                      # log entries that make a commit fold the log into ``used``
FOLD_SLACK_PAGES = 64             # ... or log pages beyond a quarter of the entries' + this
DURABILITY = ("group", "sync")    # Runtime(durability=...): the first is the default
GROUP_INTERVAL = 0.05             # "group": seconds a result may wait in memory before its commit
GROUP_RECORDS = 10_000            # ... or records (or GROUP_BYTES of them) that commit at once
                                  # (a bound on one transaction; at 2,000 it, not the interval,
                                  # set the commit rate from 40,000 results /s on)
GROUP_BYTES = 16 << 20
ENTRY_BYTES = b"stored_bytes"     # meta: the bytes of the entries' records and of the LLM
                                  # node states (max_bytes); b"entry_bytes" before, entries
                                  # only (a store that has only that is counted once anew)
LRU_LOW = 0.8                     # max_bytes exceeded at a commit: evict down to this share


def _usage(v: bytes | None) -> tuple[int, int]:
    if v is None or len(v) != USAGE.size:
        return 0, 0
    return USAGE.unpack(v)


class DamagedRecordWarning(UserWarning):
    """A stored record could not be read (damaged or foreign): it was treated as a miss."""


def pack_record(payload: dict, kind: int = KIND_CELL) -> bytes:
    """The stored bytes of a record given as :func:`unpack_record` returns it (for tests and
    tools; the runtime packs its records itself). ``kind`` other than KIND_CELL is for tests."""
    from incr._core import pack_record_fields
    deps = []
    for kind_, ref, h in payload["deps"]:
        if kind_ == "i":
            deps.append(("i", ref, h))
        else:
            deps.append(("c", ref[0], ref[1], ref[2], h))
    data = pack_record_fields(payload["cell"], payload["label"], payload["args"],
                              payload["val"], payload["vh"], deps, payload["run"])
    return data[:3] + bytes((kind,)) + data[4:]


def unpack_record(data: bytes) -> dict:
    """Check and decode one record: ``{cell, label, args, val, vh, run, deps}``, each dependency
    ``[kind, ref, hash]`` (``ref``: an input's name, or ``[identity, args, instance key]``).
    Raises ValueError (only) if it is not a sound record."""
    from incr._core import read_record
    return read_record(data).as_dict()


_ALGORITHM = {b"x": "xxh3_128", b"b": "blake2b"}


def _check_remote(kind: bytes, key: bytes, data: bytes, run: int) -> bytes:
    """A record read from a remote tier, checked as a local one is and, for an entry, by its
    content address too; returned as this store keeps it (an entry carries this store's
    ``run``). ValueError (only) if it fails a check: the caller treats it as a miss."""
    if len(data) > MAX_RECORD + HEADER.size:
        raise ValueError("longer than a record may be")
    if kind == b"x":
        items = _index_items(data) if data else None
        if not items:
            raise ValueError("not an index node")
        alg = _ALGORITHM.get(key[:1])
        ik = key[:-16]
        if alg is None or len(ik) != _ikey_len(key):
            raise ValueError("not an index key")
        from incr.keys import instance_key
        for it in items:            # each item as the lookup will read it, checked now
            blobs, at = [], 1
            while at < len(it):
                n = int.from_bytes(it[at:at + 4], "big")
                blobs.append(it[at + 4:at + 4 + n])
                at += 4 + n
            if it[:1] == b"E":
                if blobs[0][:len(ik)] != ik or len(blobs[0]) != 2 * len(ik):
                    raise ValueError("it names an entry of another instance")
            elif it[:1] == b"c":
                try:
                    ident = blobs[0].decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("a cell identity is not UTF-8") from None
                if instance_key(ident, blobs[1], alg) != blobs[2]:
                    raise ValueError("a cell's instance key does not match it")
            else:
                try:
                    blobs[0].decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("an input name is not UTF-8") from None
        return data
    if kind == b"n":
        from incr.keys import checksum
        if len(data) < HEADER.size:
            raise ValueError("shorter than a header")
        magic, fmt, k, length, crc = HEADER.unpack_from(data)
        if magic != MAGIC or fmt != FORMAT or k != KIND_NODE:
            raise ValueError("not an LLM node state of this format")
        if length != len(data) - HEADER.size or checksum(data[HEADER.size:]) != crc:
            raise ValueError("length or checksum mismatch")
        return data
    import msgpack
    from incr.keys import digest, instance_key
    rec = unpack_record(data)          # header, length, checksum, layout
    alg = _ALGORITHM.get(key[:1])
    if alg is None or len(key) != 2 * _ikey_len(key):
        raise ValueError("not an entry key")
    n = _ikey_len(key)
    if instance_key(rec["cell"], rec["args"], alg) != key[:n]:
        raise ValueError("its cell and arguments are not those of its key")
    if digest("value", rec["val"], alg) != rec["vh"]:
        raise ValueError("its value does not hash to its value hash")
    deps = []
    for k, ref, h in rec["deps"]:
        if k == "i":
            deps.append(["i", ref, h])
        else:
            if instance_key(ref[0], ref[1], alg) != ref[2]:
                raise ValueError("a dependency's instance key does not match it")
            deps.append(["c", [ref[0], ref[1]], h])
    if digest("trace", msgpack.packb(deps, use_bin_type=True), alg) != key[n:]:
        raise ValueError("its dependencies are not those of its key")
    rec["run"] = run
    return pack_record(rec)


INDEX_ROOT = bytes(16)            # the root node id of an instance's index
PREFETCH_MAX = 20_000             # instances whose bundles one remote miss may bring
BUNDLE_ENTRY_MAX = 64 << 10       # entries larger than this are not bundled (read alone)


def _item_blobs(it: bytes) -> list[bytes]:
    blobs, at = [], 1
    while at < len(it):
        n = int.from_bytes(it[at:at + 4], "big")
        blobs.append(it[at + 4:at + 4 + n])
        at += 4 + n
    return blobs


def _bundles(push: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The remote tier's bundles of a commit: per instance key, its index nodes and entries
    (not larger than BUNDLE_ENTRY_MAX) among ``push`` ((b"x"|b"e") + key, value), as one
    record ``b"b"`` + instance key: kind (1 byte) | key blob | value blob, repeated."""
    by: dict[bytes, list[bytes]] = {}
    for k, v in push:
        kind, key = k[:1], k[1:]
        if kind not in (b"x", b"e") or (kind == b"e" and len(v) > BUNDLE_ENTRY_MAX):
            continue
        ik = key[:_ikey_len(key)]
        by.setdefault(ik, []).append(kind + len(key).to_bytes(4, "big") + key
                                     + len(v).to_bytes(4, "big") + v)
    return [(b"b" + ik, b"".join(parts)) for ik, parts in by.items()]


def _bundle_items(data: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """(kind, key, value) of each record of a bundle; ValueError if it is malformed."""
    out, at, n = [], 0, len(data)
    if not n:
        raise ValueError("an empty bundle")
    while at < n:
        if at + 5 > n:
            raise ValueError("a bundle's record is cut short")
        kind = data[at:at + 1]
        kl = int.from_bytes(data[at + 1:at + 5], "big")
        key = data[at + 5:at + 5 + kl]
        at += 5 + kl
        if len(key) != kl or at + 4 > n:
            raise ValueError("a bundle's key overruns it")
        vl = int.from_bytes(data[at:at + 4], "big")
        v = data[at + 4:at + 4 + vl]
        at += 4 + vl
        if len(v) != vl:
            raise ValueError("a bundle's value overruns it")
        out.append((kind, key, v))
    return out


def _forget_inherited(env: Any) -> None:
    """In a fork()ed child: release the parent's environment handle without touching the
    parent. mdb_env_close in the child unmaps the child's copy and closes the child's
    descriptors; it clears reader slots only for the child's own pid, and fcntl locks are not
    inherited, so the parent's locks and readers are untouched (py-lmdb leaves the parent's
    transactions alone in a child). py-lmdb must forget the handle too, or it refuses to open
    the same files again in this process."""
    try:
        env.close()
    except Exception:
        pass


_live: "weakref.WeakSet[Store]" = weakref.WeakSet()
_registry_lock = threading.RLock()
_open_stores: "dict[str, weakref.ref[Store]]" = {}   # realpath -> the Store that has it open


def _after_fork_in_child() -> None:
    # forget every inherited environment at once, so that a child can open any store anew
    # (its own Runtime on the same path, or the parent's Runtime, reopened on first use)
    global _registry_lock
    _registry_lock = threading.RLock()     # a parent thread may have held it: not ours
    _open_stores.clear()
    for s in list(_live):
        s._forget_after_fork()


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


def store_path(path: Any) -> str:
    """The absolute path of a store given as ``store=``: a str, bytes (os.fsdecode) or
    os.PathLike. TypeError for anything else; ValueError for an empty path ("" or Path(""),
    which is "."), which would make the current directory a store."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(f"store must be a path (str, bytes or os.PathLike), got "
                        f"{type(path).__name__}: {path!r:.80}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if p == "" or os.path.normpath(p) == ".":   # "", ".", "./", "sub/..": the current directory
        raise ValueError(f"store must name a directory of its own, got {path!r} (the current "
                         f"directory); for example store='.incr'")
    if "\0" in p:
        raise ValueError(f"store path {p!r} contains a NUL character")
    return os.path.abspath(p)


def _existing_ancestor(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _free_bytes(path: str) -> int | None:
    """Bytes this process may still write on the file system holding ``path`` (root may use
    the reserved blocks), or None if unknown."""
    try:
        st = os.statvfs(_existing_ancestor(path))
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


_DAMAGE = tuple(getattr(lmdb, n) for n in (
    "CorruptedError", "PageNotFoundError", "PanicError", "InvalidError", "BadChecksumError",
    "VersionMismatchError", "IncompatibleError") if hasattr(lmdb, n))


def _explain(path: str, e: BaseException, doing: str, need: int = 0) -> StoreError:
    """The StoreError for an lmdb (or OS) error met while ``doing`` something with the store at
    ``path``: says what happened and what to do. ``need``: bytes the operation was writing."""
    text = str(e)
    code = getattr(e, "errno", None)
    full = (isinstance(e, lmdb.DiskError) or code in (errno.ENOSPC, errno.EDQUOT)
            or os.strerror(errno.ENOSPC) in text or os.strerror(errno.EDQUOT) in text)
    if not full and (code == errno.EIO or os.strerror(errno.EIO) in text):
        # LMDB reports a short write (a disk that filled up under it) as EIO
        free = _free_bytes(path)
        full = free is not None and free < need + MIN_FREE
    if full:
        free = _free_bytes(path)
        room = "" if free is None else f" ({free} bytes free)"
        return StoreError(
            f"store {path}: the disk is full{room} while {doing} ({text}); earlier results are "
            f"intact and the values stay in memory. Free some space on that file system (or "
            f"move the store), then run again.")
    if isinstance(e, lmdb.MapFullError) or "MDB_MAP_FULL" in text:
        return StoreError(
            f"store {path}: the LMDB map is full and could not grow while {doing} ({text}); "
            f"earlier results are intact. Run `incr gc {path} --compact`, or bound the store "
            f"with Runtime(store=..., max_bytes=...).")
    if isinstance(e, _DAMAGE):
        return StoreError(
            f"store {path} is damaged: its LMDB pages cannot be read while {doing} ({text}). "
            f"The store is a cache: delete {path} (or move it aside) and its values are "
            f"computed again, or restore it from a backup.")
    if isinstance(e, lmdb.ReadonlyError):
        return StoreError(f"store {path} is read-only ({text}); incr needs to write there. "
                          f"Use a writable location.")
    return StoreError(f"store {path}: {doing} failed: {text}")


def _lock_file(path: str) -> int:
    """The descriptor of the store's ``incr.lock`` (created if missing): every open Store holds
    a shared flock on it, compaction an exclusive one."""
    try:
        return os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                       0o600)
    except OSError as e:
        raise StoreError(f"store {path}: cannot open its lock file {LOCK_FILE} "
                         f"({e.strerror}); incr needs to write in {path}") from None


def _holder(path: str) -> "Store | None":
    """The Store of this process that has ``path`` open, if any (call with _registry_lock)."""
    key = os.path.realpath(path)
    ref = _open_stores.get(key)
    s = ref() if ref is not None else None
    if s is None or s.env is None or s.closed:
        return None
    return s


def _refuse_if_open(path: str, me: "Store | None" = None) -> None:
    """StoreError if another Store of this process has ``path`` open (LMDB must not be opened
    twice in a process); one that only a dropped Runtime still holds is collected first, so
    running ``rt = Runtime(store=p)`` again works once the old runtime is unreachable. Call
    with _registry_lock held."""
    other = _holder(path)
    if other is not None and other is not me:
        del other
        gc.collect()                             # a dropped Runtime in a reference cycle
        other = _holder(path)
    if other is not None and other is not me:
        raise StoreError(
            f"store {path} is already open in this process by another Runtime (or cache); "
            f"call .close() on it (rt.close()) before opening the store again, or use "
            f"another directory")


class Store:
    """An open LMDB store. One per runtime; reopened transparently after ``fork()``.

    Threads: any thread may call it. Each transaction of ours is counted per thread while it
    is open (the pass's read transaction from ``pass_cursor`` to ``end_pass`` included), and
    only the thread that began the pass uses its cursor. ``commit`` and ``close`` wait until
    the other threads' transactions have ended; after ``close``, every call that needs the
    environment raises StoreError. So no thread ever uses a handle another thread freed."""

    def __init__(self, path: Any, *, max_bytes: int | None = None, count_run: bool = True,
                 create: bool = True, durability: str = "sync", remote: Any = None):
        if durability not in DURABILITY:
            raise ValueError(f"Runtime: durability must be 'group' or 'sync', got "
                             f"{durability!r:.80}")
        self.durability = durability
        self.interval = GROUP_INTERVAL     # (read once: tests set the module constants first)
        self.group_records = GROUP_RECORDS
        self.group_bytes = GROUP_BYTES
        self.path = store_path(path)
        self.max_bytes = max_bytes
        self.count_run = count_run
        self.create = create
        self.env = None
        self.closed = False
        self.pending: dict[bytes, bytes] = {}
        self.pending_nodes: dict[bytes, bytes] = {}
        self.pending_index: dict[bytes, list[bytes]] = {}   # node -> items, oldest first
        self.hit_tags = bytearray()      # usage tags of the entries taken, once per hit
        self.seq = 0                      # log entries this run has written
        self.reader = None               # a read transaction kept for one pass (end_pass)
        self.cursor = None               # a cursor of that transaction on ``entries``
        self._ops = None                 # its bound methods (see pass_cursor)
        self._iops = None                # ... and those the index lookup uses (pass_cursor)
        self.damaged: set[bytes] = set() # damaged entries seen: replaced at the next commit
        self._lk = threading.RLock()     # _cond's lock (taken directly where it is hot)
        self._cond = threading.Condition(self._lk)
        self._users: dict[int, int] = {} # thread ident -> transactions of ours it has open
        self._pass_thread: int | None = None
        self._parked = False             # "group": the pass outlives its top-level demand (its
        self._pass_began = 0.0           # thread uses no cursor until unparked, see pass_ops)
        self._draining = 0               # commit/close waiting for other threads' transactions
        self._unlock = None              # releases the shared flock on incr.lock
        # group commit: the buffers are swapped under _buf_lock (writers from another thread
        # append under it); _since is when the oldest uncommitted result was buffered (None:
        # nothing waits), guarded by _timer, which the commit thread waits on. Both locks are
        # taken with the raw lock's own (C) `with` (_lk, _timer_lock), never the Condition's:
        # Condition.__enter__ is Python code, and a Ctrl-C landing after its acquire but before
        # the `with` block begins leaves the lock held for ever (the next commit_due of the
        # same thread then deadlocks; found by tests/chaos' random Ctrl-C)
        self._buf_lock = threading.Lock()
        self._pending_bytes = 0
        self._since: float | None = None
        self._timer_lock = threading.Lock()
        self._timer = threading.Condition(self._timer_lock)
        self._timer_thread: threading.Thread | None = None
        self._bg_error: BaseException | None = None   # a background commit's failure, raised
        # the remote tier (incr.tiers): records taken from it wait here for the next commit
        # (written locally, never pushed back); _recent: usage tag -> the commit of this
        # process that last wrote or took it (the LRU order within the current run)
        self.remote = None
        self.fill: dict[bytes, bytes] = {}
        self.fill_index: dict[bytes, bytes] = {}
        self.fill_nodes: dict[bytes, bytes] = {}
        self._bundled: set[bytes] = set()  # instances whose remote bundle was asked for
        self._recent: dict[bytes, int] = {}
        self._wseq = 0
        self.evicted = 0                  # entries max_bytes evicted while open
        self.evicted_nodes = 0            # ... and LLM node states
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
            raise ValueError(f"Store: max_bytes must be a positive int or None, got "
                             f"{max_bytes!r:.80}")
        tier = None
        if remote is not None:
            from incr.tiers import open_tier
            tier = open_tier(remote)       # (a bad URL is refused before the store opens)
        try:
            self._open()                               # by the next commit of the runtime
        except BaseException:
            if tier is not None:
                with contextlib.suppress(Exception):
                    tier.close()
            raise
        if tier is not None:
            from incr.tiers import Remote
            self.remote = Remote(tier)

    # -- opening --------------------------------------------------------------------------

    def _open(self) -> None:
        path = self.path
        parent = os.path.dirname(path) or "."
        fs = _fs_type(_existing_ancestor(path))
        if fs in NETWORK_FS or (fs or "").startswith("fuse.sshfs"):
            raise StoreError(
                f"store {path} is on a network file system ({fs}); LMDB's locks do not work "
                f"there. Put the store on a local disk.")
        if not self.create and not os.path.isfile(os.path.join(path, "data.mdb")):
            raise StoreError(f"there is no incr store at {path} (no data.mdb); give the "
                             f"directory a Runtime(store=...) wrote")
        # LMDB maps its lock file and grows sparse files: on a full file system touching
        # them is a SIGBUS, so refuse before LMDB (or anything) writes
        free = _free_bytes(path)
        if free is not None and free < MIN_FREE:
            raise StoreError(
                f"store {path}: only {free} bytes free on its file system; incr needs at "
                f"least {MIN_FREE} to open a store. Free some space there, or choose a store "
                f"on another file system.")
        created = False
        if self.create:
            try:
                if parent and not os.path.isdir(parent):
                    os.makedirs(parent, exist_ok=True)
                os.mkdir(path, 0o700)
                created = True
            except FileExistsError:
                pass
            except OSError as e:
                raise StoreError(f"cannot create store directory {path}: {e.strerror}. Choose "
                                 f"a writable location.") from None
        if not os.path.isdir(path):
            raise StoreError(f"store path {path} exists and is not a directory")
        if created:   # only a directory incr made is made owner-only (whatever the umask)
            try:
                os.chmod(path, 0o700)
            except OSError:
                pass
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError as e:
            raise StoreError(f"cannot use store directory {path}: {e.strerror}") from None
        # root writes anywhere: a directory nobody may write to is read-only for it too
        if not os.access(path, os.W_OK) or not mode & 0o222:
            raise StoreError(f"store directory {path} is not writable (mode {mode:04o}); incr "
                             f"writes its lock and data files there. Make it writable "
                             f"(chmod u+w) or choose another directory.")
        with _registry_lock:
            _refuse_if_open(path, self)
            fd = _lock_file(path)
            self._unlock = weakref.finalize(self, os.close, fd)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)  # waits while `incr gc --compact` runs
                except OSError as e:
                    raise StoreError(f"store {path}: cannot lock {LOCK_FILE} ({e.strerror})")
                self._open_env(path)
            except BaseException:
                self._unlock()
                raise
            _open_stores[os.path.realpath(path)] = weakref.ref(self)

    def _open_env(self, path: str) -> None:
        size = INITIAL_MAP
        data = os.path.join(path, "data.mdb")
        if os.path.exists(data):
            size = max(size, os.path.getsize(data) * 2)
        try:
            # "group": the meta page is not flushed by each commit but by the next one (LMDB's
            # MDB_NOMETASYNC: integrity kept, a power loss may undo the last commit)
            env = lmdb.open(path, map_size=size, max_dbs=12, mode=0o600, subdir=True,
                            readahead=False, meminit=False, max_readers=256,
                            metasync=self.durability == "sync")
        except lmdb.Error as e:
            raise _explain(path, e, "opening it") from None
        try:
            env.reader_check()
            with _begin(env, write=True) as txn:
                # (the databases are opened in this transaction: _begin adopted a map another
                # process grew, which open_db's own transaction would refuse, MAP_RESIZED)
                self.meta = env.open_db(b"meta", txn=txn)
                self.entries = env.open_db(b"entries", txn=txn)
                self.used = env.open_db(b"used", txn=txn)
                self.nodes = env.open_db(b"nodes", txn=txn)
                self.log = env.open_db(b"log", txn=txn)
                self.index = env.open_db(b"index", txn=txn)
                self.runs = env.open_db(b"runs", txn=txn)
                self.programs = env.open_db(b"programs", txn=txn)
                self.used_by = env.open_db(b"used_by", txn=txn)
                fmt = txn.get(b"format", db=self.meta)
                if fmt in UPGRADE:
                    # an older layout: its entries are not indexed and their records carry
                    # the old format; dropped, so they become misses and are written anew
                    for db in (self.entries, self.used, self.log, self.nodes, self.index,
                               self.runs, self.programs, self.used_by):
                        txn.drop(db, delete=False)
                    txn.put(b"format", str(FORMAT).encode(), db=self.meta)
                    txn.put(ENTRY_BYTES, b"0", db=self.meta)
                    warnings.warn(f"incr store {path} was written in format {fmt.decode()}; "
                                  f"it now has format {FORMAT} and its old results are "
                                  f"computed again", DamagedRecordWarning, stacklevel=4)
                elif fmt is None:
                    if txn.stat(self.entries)["entries"]:
                        raise StoreError(f"store {path} has entries but no format record")
                    txn.put(b"format", str(FORMAT).encode(), db=self.meta)
                    txn.put(b"created", str(time.time()).encode(), db=self.meta)
                    txn.put(ENTRY_BYTES, b"0", db=self.meta)
                elif fmt != str(FORMAT).encode():
                    raise StoreError(
                        f"store {path} has format {fmt[:20]!r}; this version of incr reads "
                        f"format {FORMAT}. Use another directory, or delete this one.")
                run = int(txn.get(b"runs", b"0", db=self.meta))
                if self.count_run:
                    run += 1
                    txn.put(b"runs", str(run).encode(), db=self.meta)
                    prog = _program().encode("utf-8", "surrogateescape")
                    pid = txn.get(prog, db=self.programs)
                    if pid is None or len(pid) != 4:
                        n = int(txn.get(b"programs", b"0", db=self.meta)) + 1
                        txn.put(b"programs", str(n).encode(), db=self.meta)
                        pid = n.to_bytes(4, "big")
                        txn.put(prog, pid, db=self.programs)
                    txn.put(run.to_bytes(8, "big"), pid, db=self.runs)
        except StoreError:
            env.close()
            raise
        except lmdb.Error as e:
            env.close()
            raise _explain(path, e, "opening it") from None
        except ValueError:
            env.close()
            raise StoreError(f"store {path} has a damaged meta record") from None
        self.env = env
        self.run = run
        self.pid = os.getpid()
        _live.add(self)

    def __del__(self) -> None:
        # a Runtime dropped without close(): what "group" durability still buffers is written
        try:
            if (not self.closed and self.env is not None and self.pid == os.getpid()
                    and self._buffered()):
                self.commit(wait=1.0)
        except Exception:
            pass

    def _forget_after_fork(self) -> None:
        """In a fork()ed child (see _after_fork_in_child): drop what belongs to the parent."""
        env, self.env = self.env, None
        self.reader, self.cursor, self._ops = None, None, None
        self._lk = threading.RLock()
        self._cond = threading.Condition(self._lk)
        # what the parent buffered is the parent's to write (it committed what it could just
        # before the fork); the commit thread did not cross the fork
        self._buf_lock = threading.Lock()
        self._timer_lock = threading.Lock()
        self._timer = threading.Condition(self._timer_lock)
        self._timer_thread = None
        self._since, self._bg_error = None, None
        # a forked child usually ends with os._exit(), which skips atexit (multiprocessing's
        # workers do): in the child, the inherited store commits every top-level demand
        self.durability = "sync"
        self.pending, self.pending_nodes, self.pending_index = {}, {}, {}
        self.hit_tags, self.damaged, self._pending_bytes, self.seq = bytearray(), set(), 0, 0
        self.fill, self.fill_index, self.fill_nodes = {}, {}, {}
        self._bundled = set()
        if self.remote is not None:
            self.remote.after_fork()
        self._iops = None
        self._users, self._pass_thread, self._draining = {}, None, 0
        self._parked = False
        if self._unlock is not None:
            self._unlock()   # our copy of the descriptor: the parent's lock stays
        if env is not None:
            _forget_inherited(env)

    def _env(self) -> lmdb.Environment:
        """The environment, reopened in a fork()ed child (an LMDB environment must not cross
        fork()): every use of the handles goes through here first. StoreError once closed."""
        if self.closed:
            raise StoreError(f"store {self.path} is closed (rt.close() was called, perhaps by "
                             f"another thread); open a new Runtime to use it")
        if os.getpid() != self.pid:
            with self._lk:
                if os.getpid() != self.pid:
                    self.pending.clear()      # the parent writes what it buffered
                    self.pending_nodes.clear()
                    self.fill, self.fill_index, self.fill_nodes = {}, {}, {}
                    self.hit_tags = bytearray()
                    self.seq = 0
                    self.damaged.clear()
                    if self.env is not None:  # a fork the at-fork handler did not see
                        env, self.env = self.env, None
                        self.reader, self.cursor, self._ops = None, None, None
                        self._pass_thread = None
                        if self._unlock is not None:
                            self._unlock()
                        _forget_inherited(env)
                    self._open()
        return self.env

    def _begin(self, **kw: Any) -> lmdb.Transaction:
        """A transaction on the environment (for tests and tools in this thread)."""
        return _begin(self._env(), **kw)

    # -- threads ----------------------------------------------------------------------------

    def _enter(self) -> lmdb.Environment:
        """Count a transaction of this thread (call with self._cond held)."""
        me = threading.get_ident()
        while self._draining and not self._users.get(me) and not self.closed:
            self._cond.wait()   # let a waiting commit or close go first
        env = self._env()
        self._users[me] = self._users.get(me, 0) + 1
        return env

    def _leave(self) -> None:
        with self._lk:
            me = threading.get_ident()
            n = self._users.get(me, 0) - 1
            if n > 0:
                self._users[me] = n
            else:
                self._users.pop(me, None)
                self._cond.notify_all()

    def _drain(self, wait: float | None = None) -> bool:
        """Wait until no other thread has a transaction of ours open (call with self._cond
        held). A thread that ended with one open has abandoned it: it is forgotten. With
        ``wait``: False if they still have one after that many seconds."""
        me = threading.get_ident()
        end = None if wait is None else time.monotonic() + wait
        self._draining += 1
        try:
            while True:
                others = [t for t, n in self._users.items() if t != me and n > 0]
                if others and self._parked and self._pass_thread in others:
                    self._release_pass()    # parked: its thread is between demands
                    continue
                if not others:
                    return True
                if end is not None and time.monotonic() >= end:
                    return False
                alive = {t.ident for t in threading.enumerate()}
                for t in others:
                    if t not in alive:
                        del self._users[t]
                        if self._pass_thread == t:
                            self.reader = self.cursor = self._ops = None
                            self._pass_thread = None
                self._cond.wait(0.5)
        finally:
            self._draining -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def _txn(self, doing: str, db: str | None = None, **kw: Any) -> Iterator[lmdb.Transaction]:
        """A transaction on the DB named by attribute ``db`` (looked up after _env(), so a
        forked child uses its own handles), counted for close(); lmdb errors become
        StoreError saying what to do."""
        with self._lk:
            env = self._enter()
        try:
            try:
                with _begin(env, db=getattr(self, db) if db else None, **kw) as txn:
                    yield txn
            except lmdb.Error as e:
                raise _explain(self.path, e, doing) from None
        finally:
            self._leave()

    def close(self) -> None:
        """Commit nothing (the runtime commits first), apply max_bytes, close the environment.
        From another thread: waits until that thread's transaction or pass has ended.
        Idempotent."""
        with self._timer_lock:
            self._timer.notify_all()        # the commit thread sees `closed` and ends
        if self.remote is not None and not self.closed and self.pid == os.getpid():
            self.remote.close()             # (flushes what waits, at most FLUSH_TIMEOUT)
        with self._lk:
            if self.closed:
                return
            self.end_pass()
            self._drain()
            try:
                if self.env is not None and os.getpid() == self.pid:
                    if self.max_bytes is not None and self.count_run:
                        try:
                            collect(self, keep_runs=None, max_bytes=self.max_bytes)
                        except StoreError:
                            pass
                    self.env.close()
            finally:
                self.closed = True
                self.env = None
                self.reader, self.cursor, self._ops = None, None, None
                with _registry_lock:
                    key = os.path.realpath(self.path)
                    ref = _open_stores.get(key)
                    if ref is not None and ref() in (self, None):
                        del _open_stores[key]
                if self._unlock is not None:
                    self._unlock()
                self._cond.notify_all()

    # -- reading --------------------------------------------------------------------------

    @property
    def pass_ops(self) -> tuple | None:
        """The pass's cursor methods (see pass_cursor), for the thread that began the pass;
        None for any other (it must call pass_cursor), and in a forked child (the fork
        handler forgets the pass). Read before every lookup: kept cheap. A parked pass is
        unparked first (or ended, and None returned, if it is older than the interval)."""
        if self._pass_thread == threading.get_ident():
            if self._parked:
                return self._unpark()
            return self._ops
        return None

    def _unpark(self) -> tuple | None:
        with self._lk:
            if not self._parked or self._pass_thread != threading.get_ident():
                return None                 # released by a commit of another thread
            self._parked = False
            if time.monotonic() - self._pass_began > self.interval:
                self.end_pass()             # a newer snapshot: what others wrote since
                return None
            return self._ops

    def park_pass(self) -> None:
        """The end of a top-level demand ("group"): keep the pass's read transaction for the
        next demand of this thread, if it is younger than the interval; otherwise end it. A
        parked pass is ended by a commit (of any thread), by close, and by the commit thread
        once it is older than the interval."""
        if self.reader is None or self._pass_thread != threading.get_ident():
            return
        if time.monotonic() - self._pass_began > self.interval:
            self.end_pass()
            return
        self._parked = True
        if self._draining:                  # a commit of another thread waits for it
            with self._lk:
                self._cond.notify_all()

    def _commit_from_timer(self) -> None:
        """The interval is over: end a parked pass, commit what is buffered."""
        with self._lk:
            if self._parked and self.reader is not None:
                self._release_pass()
            with self._timer_lock:
                if not self._buffered():
                    self._since = None
        self.commit()

    def _release_pass(self) -> None:
        """End the pass (call with _cond held): its own thread's, or a parked one."""
        reader = self.reader
        owner = self._pass_thread
        self.reader, self.cursor, self._ops, self._iops = None, None, None, None
        self._pass_thread = None
        self._parked = False
        if os.getpid() == self.pid and reader is not None:
            try:
                reader.abort()
            except lmdb.Error:
                pass
        n = self._users.get(owner, 0) - 1
        if n > 0:
            self._users[owner] = n
        else:
            self._users.pop(owner, None)
        self._cond.notify_all()

    def pass_cursor(self) -> tuple:
        """The methods set_range, key, value and next of a cursor on ``entries`` in the pass's
        read transaction (begun if none is open; see ``end_pass``), also kept as ``pass_ops``
        until the pass ends. The runtime walks it to find an instance's entries; values are
        bytes (``buffers=False``). Only the thread that began the pass may use it: another
        gets StoreError while it lasts. ``_iops`` then holds set_key and value of a cursor on
        ``index`` and set_key and value of the one on ``entries``, for the index lookup."""
        me = threading.get_ident()
        with self._lk:
            if self.reader is not None and self._parked:
                self._release_pass()            # (its thread is between demands)
            env = self._enter()
            if self.reader is not None:
                self._leave()                   # (the pass is counted once)
                if self._pass_thread == me:
                    return self._ops
                raise StoreError(f"store {self.path} is being read by another thread; a "
                                 f"runtime and its store are used by one thread at a time")
            # claimed first, so that an interrupt (Ctrl-C lands at any bytecode) never leaves
            # a reader that no thread owns
            self._pass_thread = me
            self._parked = False
            self._pass_began = time.monotonic()
            try:
                self.reader = _begin(env, db=self.entries, buffers=False)  # adopts a grown map
                self.cursor = self.reader.cursor()
                c = self.cursor
                ic = self.reader.cursor(db=self.index)
                self._iops = (ic.set_key, ic.value, c.set_key, c.value)
                if self.remote is not None:
                    self._iops = self._read_through(self._iops)
                self._ops = (c.set_range, c.key, c.value, c.next)
            except BaseException as e:
                reader = self.reader
                self.reader = self.cursor = self._ops = None
                self._pass_thread = None
                if reader is not None:
                    try:
                        reader.abort()
                    except lmdb.Error:
                        pass
                self._leave()
                if isinstance(e, lmdb.Error):
                    raise _explain(self.path, e, "looking up stored values") from None
                raise
            return self._ops

    def damaged_record(self, key: bytes, why: str) -> None:
        """The record at ``key`` is damaged: warn, and replace it at the next commit."""
        self.damaged.add(key)
        warnings.warn(
            f"incr store {self.path}: damaged record {key.hex()[:16]}… ignored ({why}); "
            f"the value will be recomputed", DamagedRecordWarning, stacklevel=5)

    def node(self, ikey: bytes) -> bytes | None:
        """The stored state record of the LLM node instance ``ikey`` (a pending one first)."""
        rec = self.pending_nodes.get(ikey)
        if rec is not None:
            return rec
        with self._txn("reading an LLM node's state", db="nodes", buffers=False) as txn:
            rec = txn.get(ikey)
        if rec is None and self.remote is not None:
            rec = self._fetch(b"n", ikey)
        if rec is not None:
            with self._buf_lock:          # a use, for max_bytes' LRU and gc (as a hit)
                self.hit_tags += node_tag(ikey)
        return rec

    # -- the remote tier: read-through ------------------------------------------------------

    def _read_through(self, iops: tuple) -> tuple:
        """The index lookup's four cursor methods (see pass_cursor), asking the remote tier
        where the local store has no such index node or entry. Used by the pass's thread
        only, one set_key then its value at a time."""
        iset, ival, eset, evalue = iops
        got = [None, None]
        fetch = self._fetch

        def index_set(key: bytes) -> bool:
            if iset(key):
                got[0] = None
                return True
            got[0] = v = fetch(b"x", key, iset)
            return v is not None

        def index_value() -> bytes:
            v = got[0]
            return ival() if v is None else v

        def entry_set(key: bytes) -> bool:
            if eset(key):
                got[1] = None
                return True
            got[1] = v = fetch(b"e", key)
            return v is not None

        def entry_value() -> bytes:
            v = got[1]
            return evalue() if v is None else v

        return index_set, index_value, entry_set, entry_value

    def _fetch(self, kind: bytes, key: bytes, local: Any = None) -> bytes | None:
        """The record of kind ``kind`` (b"e" entry, b"x" index node, b"n" LLM node state)
        at ``key`` from the remote tier, checked (a damaged one is a miss and a warning),
        kept to be written locally at the next commit; None if the remote has none. The
        root index node of an instance comes with the instance's bundle, and the bundles of
        the cells its traces read (see _prefetch); ``local(key)``: whether the local index
        has a node."""
        fill = self.fill if kind == b"e" else self.fill_index if kind == b"x" else self.fill_nodes
        v = fill.get(key)
        if v is not None:
            return v
        if kind == b"x" and key[-16:] == INDEX_ROOT and len(key) > 16:
            got = self._prefetch(key[:-16], key, local)
            return got if got is not None else fill.get(key)
        got = self.remote.get([kind + key])[0]
        if got is None:
            return None
        try:
            v = _check_remote(kind, key, got, self.run)
        except ValueError as e:
            self.remote.damaged(kind + key, str(e))
            return None
        with self._buf_lock:
            fill[key] = v
        return v

    def put_node(self, ikey: bytes, record: bytes) -> None:
        with self._buf_lock:
            self.pending_nodes[ikey] = record
            self._pending_bytes += len(record)

    def end_pass(self) -> None:
        """Close the pass's read transaction (before a commit, and at the end of a pass).
        Only the thread that began the pass ends it; for any other this does nothing."""
        with self._lk:
            if self.reader is None or self._pass_thread != threading.get_ident():
                return
            self._release_pass()

    def iter_records(self) -> Iterator[tuple[bytes, dict | None, int]]:
        """Every entry: (key, record or None if damaged, size in bytes)."""
        from incr._core import read_record
        with self._txn("reading its entries", db="entries", buffers=False) as txn:
            items = list(txn.cursor())
        for k, v in items:
            try:
                rec = read_record(v).as_dict()
            except ValueError:
                rec = None
            yield k, rec, len(v)

    def iter_nodes(self) -> Iterator[tuple[bytes, bytes]]:
        """Every saved LLM node state: (instance key, raw record)."""
        with self._txn("reading its LLM node states", db="nodes", buffers=False) as txn:
            items = list(txn.cursor())
        yield from items

    def usage(self) -> dict[bytes, tuple[int, int]]:
        """Entry key -> (hits, last run that wrote or hit it): ``used`` plus the log."""
        by_tag: dict[bytes, tuple[int, int]] = {}
        out = {}
        with self._txn("reading its usage", buffers=False) as txn:
            for k, v in txn.cursor(db=self.used):
                by_tag[k] = _usage(v)
            for run, hit, tags in _log_entries(txn, self.log):
                for t in tags:
                    h, last = by_tag.get(t, (0, 0))
                    by_tag[t] = (h + hit, max(last, run))
            for k in txn.cursor(db=self.entries).iternext(keys=True, values=False):
                u = by_tag.get(usage_tag(k))
                if u is not None:
                    out[k] = u
        return out

    def programs_usage(self) -> tuple[dict[int, str], dict[int, int],
                                      dict[bytes, dict[int, int]]]:
        """(program id -> program, run -> program id, entry key -> {program id: last run
        that wrote or took it}): ``used_by`` plus the log. Runs before this was recorded have
        no program."""
        by_tag: dict[bytes, dict[int, int]] = {}
        out = {}
        with self._txn("reading its usage per program", buffers=False) as txn:
            names = {}
            for k, v in txn.cursor(db=self.programs):
                if len(v) == 4:
                    names[int.from_bytes(v, "big")] = k.decode("utf-8", "replace")
            runs = {r: int.from_bytes(p, "big")
                    for r, p in _run_programs(txn, self.runs).items()}
            for k, v in txn.cursor(db=self.used_by):
                if len(k) == 12 and len(v) == 8:
                    d = by_tag.setdefault(k[:8], {})
                    pid, last = int.from_bytes(k[8:], "big"), int.from_bytes(v, "big")
                    d[pid] = max(d.get(pid, 0), last)
            for run, _hit, tags in _log_entries(txn, self.log):
                pid = runs.get(run)
                if pid is None:
                    continue
                for t in tags:
                    d = by_tag.setdefault(t, {})
                    d[pid] = max(d.get(pid, 0), run)
            for k in txn.cursor(db=self.entries).iternext(keys=True, values=False):
                u = by_tag.get(usage_tag(k))
                if u is not None:
                    out[k] = u
        return names, runs, out

    def fold(self) -> None:
        """Fold the log into ``used`` (one write transaction)."""
        with self._txn("folding its usage log", write=True) as txn:
            self._fold(txn)

    def _log_is_full(self, txn: lmdb.Transaction) -> bool:
        """Fold when the log has FOLD_AT entries, or takes a quarter of the entries' pages."""
        log = txn.stat(self.log)
        if log["entries"] >= FOLD_AT:
            return True
        entries = txn.stat(self.entries)
        pages = lambda st: st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return 4 * pages(log) > pages(entries) + FOLD_SLACK_PAGES

    def _fold(self, txn: lmdb.Transaction) -> None:
        hits: Counter[bytes] = Counter()
        last: dict[bytes, int] = {}
        by: dict[bytes, int] = {}          # usage tag + program id -> last run
        progs = _run_programs(txn, self.runs)
        for run, hit, tags in _log_entries(txn, self.log):   # in run order (the key's order)
            last.update(dict.fromkeys(tags, run))
            if hit:
                hits.update(tags)
            pid = progs.get(run)
            if pid is not None:
                by.update(dict.fromkeys([t + pid for t in tags], run))
        ub = self.used_by
        for k in sorted(by):
            v = txn.get(k, db=ub)
            if v is None or len(v) != 8 or int.from_bytes(v, "big") < by[k]:
                txn.put(k, by[k].to_bytes(8, "big"), db=ub)
        cur = txn.cursor(db=self.used)
        old = dict(cur.iternext())   # one forward walk (a fold usually touches most tags)
        pack, unpack, size, out = USAGE.pack, USAGE.unpack, USAGE.size, []
        for t in sorted(last):
            v = old.get(t)
            h, run = unpack(v) if v is not None and len(v) == size else (0, 0)
            out.append((t, pack(h + hits[t], max(run, last[t]))))
        cur.putmulti(out)
        txn.drop(self.log, delete=False)

    # -- writing --------------------------------------------------------------------------

    def put(self, key: bytes, record: bytes, index: list | None = None) -> None:
        """Buffer the entry ``key`` and the index nodes, (key, value), that lead to it."""
        with self._buf_lock:
            self.pending[key] = record
            self._pending_bytes += len(record)
            if index:
                pi = self.pending_index
                for k, v in index:
                    items = pi.get(k)
                    if items is None:
                        pi[k] = [v]
                    elif items[-1] != v:
                        items.append(v)

    def hit(self, key: bytes) -> None:
        """Count one hit of the entry ``key`` (the runtime appends to ``hit_tags`` itself)."""
        self.hit_tags += usage_tag(key)

    def _buffered(self) -> bool:
        return bool(self.pending or self.hit_tags or self.damaged or self.pending_nodes
                    or self.pending_index or self.fill or self.fill_index or self.fill_nodes)

    def commit_due(self) -> None:
        """The end of a top-level demand or stabilization. "sync": commit now. "group": end
        the pass's read transaction, and commit only if the oldest buffered result has waited
        GROUP_INTERVAL or GROUP_RECORDS (GROUP_BYTES) are buffered; otherwise the commit
        thread commits them when the interval is over (and close, exit and fork do)."""
        if self.durability == "sync" or self._bg_error is not None:
            self.commit()
            return
        now = time.monotonic()
        if self.reader is not None and self._pass_thread == threading.get_ident():
            self.park_pass()
        since = self._since
        if since is not None:   # (read unlocked: see the end of _write)
            if (now - since >= self.interval or len(self.pending) >= self.group_records
                    or self._pending_bytes >= self.group_bytes):
                self.commit()
            return
        if not self._parked and not self._buffered():
            return
        with self._timer_lock:
            since = self._since
            if since is None:
                if not self._buffered():   # only a parked pass: the thread ends it in time
                    self._since = self._pass_began
                else:
                    self._since = now
                t = self._timer_thread
                if t is None or not t.is_alive():
                    t = self._timer_thread = threading.Thread(
                        target=_group_committer,
                        args=(weakref.ref(self), self._timer, self._timer_lock),
                        name="incr-store-commit", daemon=True)
                    t.start()
                self._timer.notify()
                return
        if (now - since >= self.interval or len(self.pending) >= self.group_records
                or self._pending_bytes >= self.group_bytes):
            self.commit()

    def commit(self, wait: float | None = None) -> bool:
        """Write everything buffered in one transaction. Raises StoreError (buffers dropped,
        earlier commits intact) if the disk or the map is full, the store refuses the write or
        it is closed, or if a background commit failed since the last call (see commit_due).
        Waits until other threads' transactions (a pass) have ended: at most ``wait`` seconds
        if given, then gives up and returns False (the buffers stay)."""
        with self._lk:
            self.end_pass()
            err, self._bg_error = self._bg_error, None
            if err is not None:
                raise err
            if not self._buffered():
                return True
            if self.closed:
                lost = len(self.pending) + len(self.pending_nodes)
                self.pending, self.pending_nodes = {}, {}
                self.hit_tags, self.damaged = bytearray(), set()
                raise StoreError(f"store {self.path} is closed (rt.close() was called, perhaps "
                                 f"by another thread); {lost} results computed since then were "
                                 f"not saved")
            if not self._drain(wait):
                return False
            env = self._env()    # (reopened in a forked child: the parent's buffers dropped)
            if not self._buffered():
                return True
            me = threading.get_ident()
            self._users[me] = self._users.get(me, 0) + 1
            try:
                self._write(env)
            finally:
                self._leave()
            return True

    def _write(self, env: lmdb.Environment) -> None:
        with self._buf_lock:
            pending, hit_tags, damaged = self.pending, self.hit_tags, self.damaged
            nodes, index = self.pending_nodes, self.pending_index
            fill, fill_index, fill_nodes = self.fill, self.fill_index, self.fill_nodes
            self.pending, self.hit_tags, self.damaged = {}, bytearray(), set()
            self.pending_nodes, self.pending_index, self._pending_bytes = {}, {}, 0
            self.fill, self.fill_index, self.fill_nodes = {}, {}, {}
        with self._timer_lock:
            self._since = None
        need = sum(map(len, pending.values())) + sum(map(len, nodes.values()))
        logs = []
        written = [usage_tag(k) for k in pending]
        written += [usage_tag(k) for k in fill if k not in pending]
        written += [node_tag(k) for k in nodes]
        written += [node_tag(k) for k in fill_nodes if k not in nodes]
        if written:
            logs.append(b"\x00" + b"".join(written))
        if hit_tags:
            logs.append(b"\x01" + hit_tags)
        for _attempt in range(8):
            try:
                push = []               # (the remote tier's copy: after the commit)
                with env.begin(write=True) as txn:
                    grown = 0               # bytes of entries added (see _entry_bytes)
                    for k in damaged:  # a damaged entry is dropped, so its recomputation lands
                        v = txn.get(k, db=self.entries)
                        if v is not None:
                            try:
                                unpack_record(v)
                            except ValueError:
                                txn.delete(k, db=self.entries)
                                grown -= len(v)
                    # entries: the first writer wins (one call for all: those already
                    # there, written by another process first, are not counted again)
                    ent = txn.cursor(db=self.entries)
                    ekeys = sorted(pending)
                    have = {k for k, _v in ent.getmulti(ekeys)} if ekeys else ()
                    new = [(k, pending[k]) for k in ekeys if k not in have]
                    if new:
                        ent.putmulti(new, overwrite=False)
                        grown += sum([len(v) for _k, v in new])
                    for k in sorted(fill):   # taken from the remote tier
                        if k not in pending and txn.put(k, fill[k], db=self.entries,
                                                        overwrite=False):
                            grown += len(fill[k])
                    for k in sorted(nodes):   # node states: the latest writer wins
                        old = txn.get(k, db=self.nodes)
                        txn.put(k, nodes[k], db=self.nodes)
                        grown += len(nodes[k]) - (0 if old is None else len(old))
                    for k in sorted(fill_nodes):
                        if k not in nodes and txn.put(k, fill_nodes[k], db=self.nodes,
                                                      overwrite=False):
                            grown += len(fill_nodes[k])
                    idx = self.index          # index nodes: the latest item first
                    icur = txn.cursor(db=idx)
                    at = sorted(index)
                    olds = dict(icur.getmulti(at)) if at else {}
                    changed = []
                    remote = self.remote is not None
                    for k in at:
                        items, old = index[k], olds.get(k)
                        v = items[0] if old is None and len(items) == 1 else \
                            _index_merge(old, items)
                        if v != old:
                            changed.append((k, v))
                        if remote:
                            push.append((b"x" + k, v))
                    if changed:
                        icur.putmulti(changed)
                    for k in sorted(fill_index):   # the local items first, then the remote's
                        old = txn.get(k, db=idx)
                        v = fill_index[k]
                        if old is not None:
                            v = _index_merge(v, list(reversed(_index_items(old) or [])))
                        if v != old:
                            txn.put(k, v, db=idx)
                    if self.max_bytes is not None and self.count_run:
                        self._bound(txn, grown, written, hit_tags)
                    elif grown:
                        self._count(txn, grown)
                    # usage: one log entry per kind, not one update per entry (see _fold)
                    seq = self.seq
                    for v in logs:
                        txn.put(LOG_KEY.pack(self.run, seq), v, db=self.log)
                        seq += 1
                    if self._log_is_full(txn):
                        self._fold(txn)
                self.seq = seq
                if self.remote is not None:
                    push.extend((b"e" + k, v) for k, v in pending.items())
                    push.extend(_bundles(push))
                    push.extend((b"n" + k, v) for k, v in nodes.items())
                    self.remote.push(push)
                if self._buffered():   # buffered by another thread meanwhile: in its interval
                    with self._timer_lock:
                        if self._since is None:
                            self._since = time.monotonic()
                            self._timer.notify()
                return
            except lmdb.MapFullError:
                # grow from a quiescent point: our transaction is aborted, and no other thread
                # has one open (commit drained them)
                try:
                    env.set_mapsize(env.info()["map_size"] * 2)
                except lmdb.Error as e:
                    raise _explain(self.path, lmdb.MapFullError(f"MDB_MAP_FULL; growing the "
                                                                f"map failed: {e}"),
                                   "writing") from None
            except lmdb.MapResizedError:
                env.set_mapsize(0)
            except (lmdb.Error, OSError) as e:
                raise _explain(self.path, e, "writing", need) from None
        raise _explain(self.path, lmdb.MapFullError("MDB_MAP_FULL after 8 doublings of the map"),
                       "writing")

    def _prefetch(self, ik: bytes, root: bytes, local: Any) -> bytes | None:
        """A lookup missed the root index node of instance ``ik`` locally: ask the remote
        for it and for the instance's *bundle* (the index nodes and entries of its latest
        traces, as one record) in one round trip, then, a level per round trip, for the
        bundles of the cells those traces read that the local index lacks (PREFETCH_MAX
        instances at most). Every record in a bundle is checked as if read alone and kept in
        the fill buffers; a warm start through the remote then costs about one round trip
        per level of the graph, not one per index node. Returns the root node read directly
        (None if none: the bundle's may be in fill_index)."""
        bundled = self._bundled
        if len(bundled) > 1 << 20:
            bundled.clear()
        level, direct, taken = [ik], None, 0
        while level:
            keys = [b"b" + k for k in level]
            if direct is None and taken == 0:
                keys.append(b"x" + root)
            vals = self.remote.get(keys)
            if taken == 0:
                direct = vals.pop()
            bundled.update(level)
            taken += len(level)
            nxt: dict[bytes, None] = {}
            for k, v in zip(level, vals):
                if v is None:
                    continue
                for dk in self._unbundle(k, v):
                    if dk in bundled or dk in nxt or dk + INDEX_ROOT in self.fill_index:
                        continue
                    if local is not None and local(dk + INDEX_ROOT):
                        continue
                    nxt[dk] = None
            level = list(nxt)[:max(0, PREFETCH_MAX - taken)]
        if direct is not None:
            try:
                direct = _check_remote(b"x", root, direct, self.run)
            except ValueError as e:
                self.remote.damaged(b"x" + root, str(e))
                return None
            with self._buf_lock:
                self.fill_index[root] = direct
        return direct

    def _unbundle(self, ik: bytes, data: bytes) -> list[bytes]:
        """Check the bundle of instance ``ik`` and keep its records in the fill buffers;
        returns the instance keys of the cells its index nodes name. A damaged bundle (or a
        record in it) is a miss and a warning: nothing of it is kept."""
        try:
            items = _bundle_items(data)
            out, deps = [], []
            for kind, key, v in items:
                if key[:len(ik)] != ik or kind not in (b"x", b"e"):
                    raise ValueError("it holds a record of another instance")
                out.append((kind, key, _check_remote(kind, key, v, self.run)))
                if kind == b"x":
                    for it in _index_items(v) or ():
                        if it[:1] == b"c":
                            blobs = _item_blobs(it)
                            deps.append(blobs[2])
        except ValueError as e:
            self.remote.damaged(b"b" + ik, str(e))
            return []
        with self._buf_lock:
            for kind, key, v in out:
                (self.fill if kind == b"e" else self.fill_index).setdefault(key, v)
        return deps

    # -- max_bytes, at every commit (LRU) ------------------------------------------------------

    def _count(self, txn: lmdb.Transaction, grown: int) -> None:
        """Keep the entries' byte count (meta ``entry_bytes``), where the store has one."""
        v = txn.get(ENTRY_BYTES, db=self.meta)
        if v is not None and v.isdigit():
            txn.put(ENTRY_BYTES, str(max(0, int(v) + grown)).encode(), db=self.meta)

    def _bound(self, txn: lmdb.Transaction, grown: int, written: list[bytes],
               hit_tags: bytes) -> None:
        """max_bytes at a commit (in its transaction): the entries and LLM node states this
        commit writes or takes (``written``: their usage tags) are the most recently used; if
        the entries and node states then take more than max_bytes, the least recently used
        others are evicted until they take LRU_LOW of it."""
        self._wseq += 1
        now = self._wseq
        recent = self._recent
        for t in written:
            recent[t] = now
        for i in range(0, len(hit_tags), 8):
            recent[bytes(hit_tags[i:i + 8])] = now
        v = txn.get(ENTRY_BYTES, db=self.meta)
        if v is not None and v.isdigit():
            total = max(0, int(v) + grown)
        else:                              # (a store written before the count: counted once)
            total = sum(len(x) for x in txn.cursor(db=self.entries).iternext(keys=False))
            total += sum(len(x) for x in txn.cursor(db=self.nodes).iternext(keys=False))
        if total > self.max_bytes:
            total = self._evict(txn, now)
        txn.put(ENTRY_BYTES, str(total).encode(), db=self.meta)

    def _evict(self, txn: lmdb.Transaction, now: int) -> int:
        """Evict least recently used entries and LLM node states (never those of the commit
        ``now``) until they take at most LRU_LOW * max_bytes; returns their bytes. Least recently used:
        by the last run that wrote or took the entry (``used``, the log folded first), and
        within this run by the commit that last did. An evicted entry's usage goes with it,
        and the index of its instance is rebuilt from the instance's other entries."""
        self._fold(txn)
        last = {k: _usage(v)[1] for k, v in txn.cursor(db=self.used)}
        recent, run = self._recent, self.run
        rows, total = [], 0
        for k, v in txn.cursor(db=self.entries):
            n = len(v)
            total += n
            t = usage_tag(k)
            r = recent.get(t)
            if r == now:
                continue                   # what this commit writes or takes: kept
            rows.append(((run, r) if r is not None else (last.get(t, 0), 0), k, n, False))
        for k, v in txn.cursor(db=self.nodes):
            n = len(v)
            total += n
            t = node_tag(k)
            r = recent.get(t)
            if r == now:
                continue
            rows.append(((run, r) if r is not None else (last.get(t, 0), 0), k, n, True))
        if total <= self.max_bytes:
            return total
        rows.sort()
        low = int(self.max_bytes * LRU_LOW)
        touched = set()
        cur = txn.cursor(db=self.used_by)
        for _when, k, n, node in rows:
            if total <= low:
                break
            txn.delete(k, db=self.nodes if node else self.entries)
            total -= n
            tag = node_tag(k) if node else usage_tag(k)
            txn.delete(tag, db=self.used)
            recent.pop(tag, None)
            if cur.set_range(tag):
                while cur.key()[:8] == tag and cur.delete():
                    pass
            if node:
                self.evicted_nodes += 1
                continue
            touched.add(k[:_ikey_len(k)])
            self.evicted += 1
        for ik in sorted(touched):
            self._reindex(txn, ik)
        return total

    def _reindex(self, txn: lmdb.Transaction, ik: bytes) -> None:
        """Write the index of instance ``ik`` anew from its entries (in ``txn``)."""
        from incr._core import index_nodes
        c = txn.cursor(db=self.index)
        if c.set_range(ik):
            while c.key()[:len(ik)] == ik and c.delete():
                pass
        recs = []
        c = txn.cursor(db=self.entries)
        if c.set_range(ik):
            for k, v in c:
                if k[:len(ik)] != ik:
                    break
                try:
                    rec = unpack_record(v)
                except ValueError:
                    continue
                recs.append((rec["run"], k, rec["deps"]))
        recs.sort(key=lambda r: r[0])      # the latest run's items first, below
        nodes: dict[bytes, list[bytes]] = {}
        for _run, k, deps in recs:
            for nk, item in index_nodes(ik, k, deps):
                items = nodes.setdefault(nk, [])
                if item not in items:
                    items.append(item)
        for nk in sorted(nodes):
            txn.put(nk, _index_merge(None, nodes[nk]), db=self.index)

    def rebuild_index(self) -> int:
        """Write the index anew from the sound entries (after gc dropped some): one write
        transaction. Returns the number of index nodes."""
        from incr._core import index_nodes
        nodes: dict[bytes, list[bytes]] = {}
        recs = [(k, r) for k, r, _size in self.iter_records() if r is not None]
        recs.sort(key=lambda kr: kr[1]["run"])     # the latest run's items first, below
        for key, rec in recs:
            for k, v in index_nodes(key[:_ikey_len(key)], key, rec["deps"]):
                items = nodes.setdefault(k, [])
                if v not in items:
                    items.append(v)
        with self._txn("rebuilding its index", write=True) as txn:
            txn.drop(self.index, delete=False)
            cur = txn.cursor(db=self.index)
            cur.putmulti([(k, _index_merge(None, v)) for k, v in sorted(nodes.items())])
        return len(nodes)

    def delete(self, keys: list[bytes]) -> int:
        n = gone = 0
        with self._txn("dropping entries", write=True) as txn:
            for k in keys:
                v = txn.pop(k, db=self.entries)
                if v is not None:
                    n += 1
                    gone += len(v)
                txn.delete(usage_tag(k), db=self.used)   # (fold first: see collect)
                cur = txn.cursor(db=self.used_by)
                tag = usage_tag(k)
                if cur.set_range(tag):
                    while cur.key()[:8] == tag and cur.delete():
                        pass
            self._count(txn, -gone)
        return n


def _group_committer(ref: "weakref.ref[Store]", timer: threading.Condition,
                     lock: threading.Lock) -> None:
    """The commit thread of a "group" store: commits what waited GROUP_INTERVAL. Holds the
    store weakly (a dropped Runtime's store is collected, and its __del__ commits), and ends
    when the store is closed or gone."""
    while True:
        with lock:
            s = ref()
            if s is None or s.closed or s.pid != os.getpid():
                return
            since, interval = s._since, s.interval
            del s
            if since is None:
                timer.wait()
                continue
            delay = since + interval - time.monotonic()
            if delay > 0:
                timer.wait(delay)
                continue
        s = ref()
        if s is None:
            return
        try:
            s._commit_from_timer()
        except StoreError as e:
            if not s.closed:
                s._bg_error = e            # the runtime's next commit raises it
        except Exception as e:             # (never lost silently)
            s._bg_error = StoreError(f"store {s.path}: a background commit failed: {e!r}")
        del s


def _commit_buffered(wait: float) -> None:
    """Commit what every open store of this process still buffers ("group" durability): at
    exit. A store whose pass another thread still holds after ``wait`` seconds is left (its
    results are computed again next time)."""
    for s in list(_live):
        try:
            if s.closed or s.env is None or s.pid != os.getpid():
                continue
            if s._buffered():
                s.commit(wait=wait)
            if s.remote is not None:
                s.remote.flush(wait)          # (the writer is a daemon thread)
        except Exception as e:
            warnings.warn(f"incr store {s.path}: results computed since the last commit were "
                          f"not saved at exit ({e})", RuntimeWarning, stacklevel=1)


def _before_fork() -> None:
    # commit what the parent buffered, so that a child (its own Runtime on the store, a
    # multiprocessing worker) finds it; only a store no thread is in the middle of using (no
    # wait here: another thread may hold what the child would need)
    for s in list(_live):
        try:
            if s.closed or s.env is None or s.pid != os.getpid() or not s._buffered():
                continue
            if not s._cond.acquire(blocking=False):
                continue
            try:
                if s._parked and s.reader is not None:
                    s._release_pass()         # (its thread is between demands)
                if not s._users and s._bg_error is None:
                    s._write(s.env)
            finally:
                s._cond.release()
        except StoreError as e:
            s._bg_error = e
        except Exception:
            pass


atexit.register(_commit_buffered, 5.0)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


INDEX_ITEMS = 8                   # alternatives an index node keeps (the latest written)
_ITEM_BLOBS = {0x45: 1, 0x69: 1, 0x63: 3}   # E(ntry), i(nput), c(ell): blobs that follow


def _index_items(v: bytes) -> list[bytes] | None:
    """The items of an index node's value, or None if it is damaged."""
    items, at, n = [], 0, len(v)
    while at < n:
        blobs = _ITEM_BLOBS.get(v[at])
        if blobs is None:
            return None
        end = at + 1
        for _ in range(blobs):
            if end + 4 > n:
                return None
            end += 4 + int.from_bytes(v[end:end + 4], "big")
            if end > n:
                return None
        items.append(v[at:end])
        at = end
    return items


def _index_merge(old: bytes | None, new: list[bytes]) -> bytes:
    """An index node's value: the items written now (the latest first), then the earlier ones
    not among them, INDEX_ITEMS at most (a damaged earlier value is dropped)."""
    out = list(reversed(new))
    for it in (_index_items(old) or []) if old is not None else []:
        if it not in out:
            out.append(it)
    return b"".join(out[:INDEX_ITEMS])


def node_tag(ikey: bytes) -> bytes:
    """The usage tag of the LLM node state of instance ``ikey``: ``N`` and its last 7 bytes
    (8 bytes, as an entry's; a collision with one, about 2**-56 per pair, shares usage)."""
    return b"N" + ikey[-7:]


def tier_stats(store: "Store | None") -> dict[str, int]:
    """The remote tier's counters for Runtime.stats() (zeros without a remote):
    remote_hits, records the remote had that passed the checks; remote_misses, keys it did
    not have (or not reachable: a read not tried during an outage is not counted);
    remote_errors, failed reads or writes plus damaged records; remote_pushed, records sent
    to it; remote_dropped, records not sent (an outage, a full queue, or closed first)."""
    st = store.remote.stats if store is not None and store.remote is not None else {}
    return {"remote_hits": st.get("found", 0) - st.get("damaged", 0),
            "remote_misses": st.get("gets", 0) - st.get("found", 0),
            "remote_errors": st.get("failures", 0) + st.get("damaged", 0),
            "remote_pushed": st.get("pushed", 0),
            "remote_dropped": st.get("dropped", 0)}


def usage_tag(key: bytes) -> bytes:
    """The 8 bytes that stand for an entry key in usage: 4 of the instance key, 4 of the
    trace hash (both past the algorithm byte). incr._core makes the same tag for each hit."""
    return key[1:5] + key[-4:]


def _program() -> str:
    """This process's program, as gc groups runs: the main script's absolute path (or "-c",
    "-m module", "<interactive>") and its arguments, as JSON."""
    import sys
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    f = getattr(main, "__file__", None)
    if spec is not None and getattr(spec, "name", None) and spec.name != "__main__":
        head = f"-m {spec.name}"
    elif f:
        head = os.path.abspath(f)
    elif sys.argv and sys.argv[0] == "-c":
        head = "-c"
    else:
        head = "<interactive>"
    return _short_program([head] + [str(a) for a in sys.argv[1:]])


MAX_PROGRAM = 480                 # bytes of a program's key (LMDB keys are at most 511)


def _short_program(words: list[str]) -> str:
    """The JSON of ``words``; if longer than MAX_PROGRAM bytes, its first words and a last
    one naming how many were left out and a hash of the whole (distinct command lines stay
    distinct programs)."""
    full = json.dumps(words, ensure_ascii=False)
    raw = full.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_PROGRAM:
        return full
    import xxhash
    h = xxhash.xxh3_64_hexdigest(raw)
    kept: list[str] = []
    for w in words:
        w = w if len(w) <= 120 else w[:120] + "\u2026"
        tail = f"\u2026 {len(words) - len(kept) - 1} more ({h})"
        if len(json.dumps(kept + [w, tail], ensure_ascii=False).encode(
                "utf-8", "surrogateescape")) > MAX_PROGRAM:
            break
        kept.append(w)
    return json.dumps(kept + [f"\u2026 {len(words) - len(kept)} more ({h})"],
                      ensure_ascii=False)


def _run_programs(txn: lmdb.Transaction, db: Any) -> dict[int, bytes]:
    """run -> program id (4 bytes) of every sound ``runs`` entry."""
    out = {}
    for k, v in txn.cursor(db=db):
        if len(k) == 8 and len(v) == 4:
            out[int.from_bytes(k, "big")] = v
    return out


def _log_entries(txn: lmdb.Transaction, db: Any) -> Iterator[tuple[int, int, list[bytes]]]:
    """(run, 1 for hits or 0 for writes, usage tags) of every sound log entry; a damaged one is
    skipped (usage is advisory: it never decides a value)."""
    for k, v in txn.cursor(db=db):
        if len(k) != LOG_KEY.size or len(v) < 1:
            continue
        run, _seq = LOG_KEY.unpack(k)
        kind, body = v[0], v[1:]
        if kind > 1 or len(body) % 8:
            continue
        yield run, kind, [body[i:i + 8] for i in range(0, len(body), 8)]


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
            dry_run: bool = False, progress: Callable[[str, int, int | None], Any] | None = None
            ) -> dict:
    """Drop entries not reachable from what the latest ``keep_runs`` runs *of each program*
    wrote or took (None: keep all), then least recently used ones while the entries take more
    than ``max_bytes``. Runs without a recorded program (count_run=False, or older) form one
    group. The report says, per program, the runs kept and how many entries they root.
    ``progress(phase, done, total)`` is told what it has done: phase "read" (entries read, every
    1000 and at the end), "drop" (0 of the dropped entries before deleting, all of them after).
    """
    usage = store.usage()
    names, run_prog, by_prog = store.programs_usage()
    recs: dict[bytes, tuple[dict | None, int]] = {}
    for key, rec, size in store.iter_records():
        recs[key] = (rec, size)
        if progress is not None and len(recs) % 1000 == 0:
            progress("read", len(recs), None)
    if progress is not None:
        progress("read", len(recs), len(recs))
    last_of = {k: max(usage.get(k, (0, 0))[1], (r or {}).get("run", 0)) for k, (r, _) in recs.items()}
    latest = max(last_of.values(), default=0)
    drop: set[bytes] = {k for k, (r, _) in recs.items() if r is None}   # damaged: useless
    programs = []
    if keep_runs is not None:
        runs_of: dict[int, list[int]] = {}
        for run, pid in run_prog.items():
            runs_of.setdefault(pid, []).append(run)
        # an entry's uses per program: used_by and the log, and the run that wrote it
        uses: dict[bytes, dict[int, int]] = {}
        for k, (r, _) in recs.items():
            u = dict(by_prog.get(k, {}))
            if r is not None and r["run"] in run_prog:
                pid = run_prog[r["run"]]
                u[pid] = max(u.get(pid, 0), r["run"])
            uses[k] = u
        floor = {pid: sorted(rs)[-keep_runs] if len(rs) >= keep_runs else min(rs)
                 for pid, rs in runs_of.items()}
        # an entry no run with a recorded program used: the latest keep_runs runs of the
        # store, as before programs were recorded
        unknown_floor = latest - keep_runs + 1
        rooted: Counter[int] = Counter()
        roots = []
        for k in recs:
            if k in drop:
                continue
            hit = [pid for pid, last in uses[k].items() if pid in floor and last >= floor[pid]]
            if hit:
                roots.append(k)
                rooted.update(hit)
            elif not uses[k] and last_of[k] >= unknown_floor:
                roots.append(k)
                rooted[-1] += 1
        for pid, rs in sorted(runs_of.items()):
            programs.append({"program": names.get(pid, f"#{pid}"),
                             "runs": sorted(rs)[-keep_runs:], "roots": rooted.get(pid, 0)})
        if rooted.get(-1):
            programs.append({"program": None,
                             "runs": list(range(max(1, unknown_floor), latest + 1)),
                             "roots": rooted[-1]})
        by_instance: dict[bytes, list[bytes]] = {}
        for k in recs:
            by_instance.setdefault(k[:_ikey_len(k)], []).append(k)
        keep: set[bytes] = set()
        stack = list(roots)
        while stack:
            k = stack.pop()
            if k in keep:
                continue
            keep.add(k)
            rec = recs[k][0]
            for kind, ref, h in rec["deps"]:
                if kind != "c":
                    continue
                for k2 in by_instance.get(ref[2], ()):
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
        if progress is not None:
            progress("drop", 0, len(drop))
        store.fold()   # so that no log entry names a dropped key
        store.delete(sorted(drop))
        store.rebuild_index()   # (nodes that lead only to dropped entries go)
        if progress is not None:
            progress("drop", len(drop), len(drop))
    return {"entries": len(recs), "dropped": len(drop), "kept": len(recs) - len(drop),
            "bytes_freed": freed, "latest_run": latest, "programs": programs}


def compact(path: Any) -> tuple[int, int]:
    """Give the pages gc freed back to the file system: LMDB's compacting copy of the store
    into a temporary file in its directory, fsynced, then renamed over ``data.mdb`` (atomic: a
    crash leaves the old file or the new one, never a mix). Returns the sizes of data.mdb
    (before, after).

    Only while no process has the store open: every Store holds a shared flock on its
    ``incr.lock`` while open, and this takes it exclusively, so it is refused (StoreError)
    while another runtime (this process's included) has the store open, and a runtime that
    opens the store meanwhile waits until the compaction is done."""
    p = store_path(path)
    data = os.path.join(p, "data.mdb")
    if not os.path.isfile(data):
        raise StoreError(f"there is no incr store at {p} (no data.mdb)")
    with _registry_lock:
        _refuse_if_open(p)
        fd = _lock_file(p)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(
                    f"store {p} is open in another process; compacting needs it to itself. "
                    f"Close the runtimes that use it (or let them end) and run "
                    f"`incr gc {p} --compact` again.") from None
            return _compact_locked(p, data)
        finally:
            os.close(fd)   # (releases the lock)


def _compact_locked(path: str, data: str) -> tuple[int, int]:
    before = os.path.getsize(data)
    for name in os.listdir(path):           # what a compaction killed midway left behind
        if name.startswith("data.mdb.compact-"):
            os.unlink(os.path.join(path, name))
    tmp = os.path.join(path, f"data.mdb.compact-{os.getpid()}")
    try:
        env = lmdb.open(path, map_size=max(INITIAL_MAP, 2 * before), max_dbs=8, subdir=True,
                        readahead=False, create=False)
    except lmdb.Error as e:
        raise _explain(path, e, "opening it to compact it") from None
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            env.copyfd(out, compact=True)
            os.fsync(out)
        finally:
            os.close(out)
    except (lmdb.Error, OSError) as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _explain(path, e, "compacting it", need=before) from None
    finally:
        env.close()
    os.replace(tmp, data)
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)                        # the rename itself is durable
    finally:
        os.close(dfd)
    return before, os.path.getsize(data)
