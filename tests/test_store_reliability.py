"""The store under stress and misuse: another thread closing it mid-pass, a full file system,
fork(), odd paths, damaged LMDB pages, a forgotten runtime on the same path, and compaction.

Whatever can crash the interpreter (a segfault, a SIGBUS) runs in a child process, whose exit
status is checked: a crash fails the test instead of ending the test run. Mounting a small tmpfs
needs root; where it is not possible those tests skip, saying why, and a test with os.statvfs
patched to report a full disk covers the refusal anyway.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import stat
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import lmdb
import pytest

import incr
from incr import store as store_mod
from incr.cli import main
from incr.store import DamagedRecordWarning, Store

_RAN: list[str] = []


@pytest.fixture(autouse=True)
def _collect_dead_runtimes():
    gc.collect()
    _RAN.clear()


def _child(code: str, *args, timeout=120):
    """Run ``code`` in a new interpreter; (return code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "incr.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _mount_tmpfs(target, size):
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(target)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if proc.returncode != 0:
        return proc.stderr.strip() or f"mount exited with {proc.returncode}"
    return None


def _umount(target):
    subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30)


def _fill(directory):
    """Write a file in ``directory`` until the file system is full."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\xff" * 4096)
    except OSError as e:
        assert e.errno in (errno.ENOSPC, errno.EDQUOT), e
    finally:
        os.close(fd)


def _make_add(inp):
    # the same code and closure (the input, by name) every time: the same identity
    @incr.cell
    def add(k):
        _RAN.append(f"add({k})")
        return inp.get() + k
    return add


# --- 9: close() from another thread while the owner computes ---------------------------------

CLOSE_RACE = r"""
import json, os, sys, tempfile, threading
import incr

base = sys.argv[1]
seen = {}          # exception type name -> [count, is an IncrError]

def note(e):
    s = seen.setdefault(type(e).__name__, [0, isinstance(e, incr.IncrError)])
    s[0] += 1

for it in range(int(sys.argv[2])):
    rt = incr.Runtime(store=os.path.join(base, f"s{it % 3}"))
    x = rt.input("x", it)

    @incr.cell
    def leaf(k):
        return x.get() + k

    @incr.cell
    def top():
        return sum(leaf(k) for k in range(50))

    rt.observe(top)
    go = threading.Event()

    def closer():
        go.wait()
        try:
            rt.close()
        except BaseException as e:
            note(e)

    t = threading.Thread(target=closer)
    t.start()
    try:
        for r in range(4):
            if r == 1:
                go.set()
            x.set(it * 10 + r)
            rt.stabilize()
            with rt:
                top()
    except BaseException as e:
        note(e)
    finally:
        go.set()
        t.join()
        rt.close()
print(json.dumps(seen))
"""


@pytest.mark.hang_limit(240)
def test_close_from_another_thread_while_stabilizing_never_crashes(tmp_path):
    # 200 runtimes, each closed by a second thread while the first stabilizes and demands.
    # On a tmpfs when there is one: the commits' fsyncs are not what this tests
    import tempfile
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=shm or tmp_path) as base:
        code, out, err = _child(CLOSE_RACE, base, 200, timeout=200)
    assert code == 0, f"the child died with {code} (-11 is SIGSEGV)\n{err[-3000:]}"
    seen = json.loads(out.strip().splitlines()[-1])
    wrong = {name: s for name, s in seen.items() if not s[1]}
    assert not wrong, f"errors that are not incr.IncrError: {wrong}\n{err[-3000:]}"


def test_store_close_from_another_thread_waits_for_the_pass(tmp_path):
    # the owner of a pass keeps using its cursor while another thread closes the store; the
    # close completes only once the pass ends, and the owner's next store call is a StoreError
    path = tmp_path / "store"
    s = Store(path)
    s.put(b"x" * 17 + b"t" * 16, b"not a record, never read as one")
    s.commit()
    events = []
    closing = threading.Event()

    def closer():
        closing.set()
        s.close()
        events.append("closed")

    set_range, key, _value, _next = s.pass_cursor()
    t = threading.Thread(target=closer)
    t.start()
    closing.wait()
    time.sleep(0.2)                      # (close() gets the chance to run, if it would)
    for _ in range(1000):               # the cursor is still sound while close() waits
        assert set_range(b"x")
        assert key() == b"x" * 17 + b"t" * 16
    events.append("used the cursor")
    s.end_pass()
    t.join(60)
    assert events == ["used the cursor", "closed"]
    with pytest.raises(incr.StoreError, match="closed"):
        s.pass_cursor()
    with pytest.raises(incr.StoreError, match="closed"):
        s.node(b"k" * 17)
    s.put(b"y" * 33, b"z")
    with pytest.raises(incr.StoreError, match=str(path)):
        s.commit()


def test_store_pass_is_used_only_by_the_thread_that_began_it(tmp_path):
    s = Store(tmp_path / "store")
    try:
        mine = s.pass_cursor()
        seen = {}

        def other():
            seen["ops"] = s.pass_ops
            try:
                s.pass_cursor()
            except incr.StoreError as e:
                seen["error"] = str(e)

        t = threading.Thread(target=other)
        t.start()
        t.join(60)
        assert seen["ops"] is None and "another thread" in seen["error"], seen
        assert s.pass_ops == mine
        s.end_pass()
    finally:
        s.close()


# --- 10: a full file system ------------------------------------------------------------------

OPEN_STORE = r"""
import json, sys
import incr
try:
    rt = incr.Runtime(store=sys.argv[1])
except incr.StoreError as e:
    print(json.dumps({"error": str(e)}))
else:
    rt.close()
    print(json.dumps({"opened": True}))
"""


@pytest.mark.hang_limit(120)
def test_store_on_a_full_file_system_is_refused_before_lmdb_maps_it(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    why = _mount_tmpfs(mnt, "1m")
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs: {why}")
    try:
        _fill(mnt)
        path = mnt / "store"
        code, out, err = _child(OPEN_STORE, path)
        assert code == 0, f"opening a store on a full file system killed the child ({code}; " \
                          f"-7 is SIGBUS)\n{err}"
        msg = json.loads(out)["error"]
        assert str(path) in msg and "free" in msg, msg
        assert not path.exists(), "nothing is created on a full file system"
    finally:
        _umount(mnt)


class _FullDisk:
    f_bsize = f_frsize = 4096
    f_blocks = 1000
    f_bfree = f_bavail = 3       # 12 KiB
    f_files = f_ffree = f_favail = 1000
    f_flag = 0
    f_namemax = 255


def test_store_is_refused_when_statvfs_reports_a_full_disk(tmp_path, monkeypatch):
    asked = []

    def statvfs(p):
        asked.append(p)
        return _FullDisk()

    monkeypatch.setattr(os, "statvfs", statvfs)
    for path in (tmp_path / "new" / "store", tmp_path):      # to create; existing, empty
        with pytest.raises(incr.StoreError) as excinfo:
            incr.Runtime(store=path)
        msg = str(excinfo.value)
        assert str(path) in msg and "12288 bytes free" in msg, msg
    assert asked
    assert not (tmp_path / "new").exists() and not (tmp_path / "data.mdb").exists()


@pytest.mark.hang_limit(120)
def test_full_disk_during_a_commit_says_the_disk_is_full(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = _mount_tmpfs(mnt, "2m")
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs: {why}")
    try:
        path = mnt / "store"
        # "sync": the demand whose commit fails raises (with "group", the commit of the
        # interval, raised by the next commit: test_store_group)
        rt = incr.Runtime(store=path, durability="sync")

        @incr.cell
        def blob(i):
            return bytes([i % 256]) * 100_000

        error = None
        with rt:
            for i in range(100):
                try:
                    blob(i)
                except incr.StoreError as e:
                    error = e
                    break
        assert error is not None, "2 MiB never filled up"
        msg = str(error)
        assert str(path) in msg and "disk is full" in msg and "Free some space" in msg, msg
        with rt:                                   # still answers from memory
            assert blob(i) == bytes([i % 256]) * 100_000
        rt.close()
    finally:
        _umount(mnt)


def test_lmdb_errors_are_explained(tmp_path, monkeypatch):
    path = str(tmp_path / "store")
    eio = lmdb.Error("mdb_txn_commit: " + os.strerror(errno.EIO))
    # an I/O error on a disk with room is not called a full disk...
    msg = str(store_mod._explain(path, eio, "writing"))
    assert path in msg and "disk is full" not in msg and os.strerror(errno.EIO) in msg
    # ... on a full one it is
    monkeypatch.setattr(os, "statvfs", lambda p: _FullDisk())
    msg = str(store_mod._explain(path, eio, "writing"))
    assert path in msg and "disk is full" in msg and "Free some space" in msg, msg
    monkeypatch.undo()
    for e in (lmdb.DiskError("mdb_txn_commit: " + os.strerror(errno.ENOSPC)),
              OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
        msg = str(store_mod._explain(path, e, "writing"))
        assert "disk is full" in msg, msg
    msg = str(store_mod._explain(path, lmdb.MapFullError("mdb_put: MDB_MAP_FULL"), "writing"))
    assert "map is full" in msg and "incr gc" in msg, msg
    for e in (lmdb.CorruptedError("mdb_get: MDB_CORRUPTED"),
              lmdb.PageNotFoundError("mdb_cursor_get: MDB_PAGE_NOTFOUND")):
        msg = str(store_mod._explain(path, e, "reading"))
        assert "damaged" in msg and f"delete {path}" in msg, msg


# --- 11: fork -----------------------------------------------------------------------------------

def _in_child(fn):
    """Run fn() in a fork()ed child; its JSON result (or the error it raised)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = fn()
            out["warnings"] = [str(c.message) for c in caught
                               if issubclass(c.category, DamagedRecordWarning)]
            os.write(w, json.dumps(out).encode())
            code = 0
        except BaseException as e:
            try:
                os.write(w, json.dumps({"error": repr(e)}).encode())
            except BaseException:
                pass
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        result = json.loads(f.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def test_forked_child_takes_values_from_the_store_on_its_first_lookup(tmp_path):
    path = tmp_path / "store"
    rt0 = incr.Runtime(store=path)
    add = _make_add(rt0.input("x", 10))
    with rt0:
        assert add(1) == 11
    rt0.close()
    _RAN.clear()
    rt = incr.Runtime(store=path)        # add(1) is in the store, not in rt's memory
    try:
        add = _make_add(rt.input("x", 10))

        def child():
            with rt:
                v = add(1)
            return {"add1": v, "ran": list(_RAN), "hits": rt.stats()["store_hits"]}

        assert _in_child(child) == {"add1": 11, "ran": [], "hits": 1, "warnings": []}
        with rt:                         # the parent still works, from the store too
            assert add(1) == 11
            assert add(2) == 12
        assert _RAN == ["add(2)"] and rt.stats()["store_hits"] == 1
    finally:
        rt.close()


def test_forked_child_can_use_every_store_entry_point(tmp_path):
    s = Store(tmp_path / "store")
    try:
        s.put(b"k" * 33, b"v")
        s.commit()

        def child():
            out = {"node": s.node(b"n" * 17), "records": len(list(s.iter_records()))}
            out["cursor"] = bool(s.pass_cursor()[0](b"k"))
            s.end_pass()
            s.put(b"c" * 33, b"from the child")
            s.commit()
            return out

        assert _in_child(child) == {"node": None, "records": 1, "cursor": True,
                                    "warnings": []}
        assert len(list(s.iter_records())) == 2       # the parent sees the child's commit
    finally:
        s.close()


# --- 12: paths ----------------------------------------------------------------------------------

@pytest.mark.parametrize("empty", ["", b"", Path("")], ids=["str", "bytes", "Path"])
def test_empty_store_path_is_a_value_error(tmp_path, monkeypatch, empty):
    monkeypatch.chdir(tmp_path)
    os.chmod(tmp_path, 0o755)
    with pytest.raises(ValueError, match="store"):
        incr.Runtime(store=empty)
    assert os.listdir(tmp_path) == [] and stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755


@pytest.mark.parametrize("bad", [5, 2.5, ["a"], object()])
def test_store_path_of_another_type_is_a_type_error_naming_the_argument(bad):
    with pytest.raises(TypeError, match="store"):
        incr.Runtime(store=bad)


def test_bytes_store_path_is_accepted(tmp_path):
    path = tmp_path / "store"
    rt = incr.Runtime(store=os.fsencode(path))
    add = _make_add(rt.input("x", 1))
    with rt:
        assert add(1) == 2
    rt.close()
    rt = incr.Runtime(store=str(path))
    add = _make_add(rt.input("x", 1))
    with rt:
        assert add(1) == 2
    assert rt.stats()["store_hits"] == 1
    rt.close()


def test_read_only_directory_is_refused_and_left_alone(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    os.chmod(d, 0o555)
    try:
        with pytest.raises(incr.StoreError) as excinfo:
            incr.Runtime(store=d)
        assert str(d) in str(excinfo.value) and "not writable" in str(excinfo.value)
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o555
        assert os.listdir(d) == []
    finally:
        os.chmod(d, 0o700)


# --- 14: clear errors -------------------------------------------------------------------------

@incr.cell(version="1")
def _padded(k):
    return "p" * 300 + str(k)


def _damage_branch_pages(path):
    """Point every child of every LMDB branch page past the end of the data: a tree walk then
    meets MDB_PAGE_NOTFOUND (LMDB checks page numbers against the last page it wrote)."""
    data = os.path.join(path, "data.mdb")
    page = os.sysconf("SC_PAGESIZE")
    buf = bytearray(open(data, "rb").read())
    n = 0
    for off in range(2 * page, len(buf), page):        # after the two meta pages
        flags = struct.unpack_from("<H", buf, off + 10)[0]
        if flags & 0x01:                                # P_BRANCH
            lower = struct.unpack_from("<H", buf, off + 12)[0]
            for i in range((lower - 16) // 2):
                node = struct.unpack_from("<H", buf, off + 16 + 2 * i)[0]
                struct.pack_into("<HHH", buf, off + node, 0xFFFF, 0xFFFF, 0x00FF)
            n += 1
    assert n, "no branch page: the store is too small to damage this way"
    with open(data, "r+b") as f:
        f.write(buf)


def test_cli_on_damaged_lmdb_pages_prints_one_line_and_what_to_do(tmp_path):
    path = tmp_path / "store"
    rt = incr.Runtime(store=path)
    with rt:
        for k in range(300):
            _padded(k)
    rt.close()
    _damage_branch_pages(path)
    for cmd in ("inspect", "gc", "graph"):
        code, out, err = _cli(cmd, path)
        assert code == 1, (cmd, code, out, err)
        assert "Traceback" not in err and err.count("\n") == 1, (cmd, err)
        assert str(path) in err and "damaged" in err and "delete" in err, (cmd, err)


@pytest.mark.parametrize("what", ["empty directory", "missing directory"])
def test_inspect_where_there_is_no_store_creates_nothing(tmp_path, what):
    path = tmp_path / "nothing"
    if what == "empty directory":
        path.mkdir()
    for cmd in ("inspect", "gc", "graph"):
        code, _out, err = _cli(cmd, path)
        assert code == 1 and f"no incr store at {path}" in err, (cmd, err)
        assert "Traceback" not in err
    if what == "empty directory":
        assert os.listdir(path) == []
    else:
        assert not path.exists()


def test_second_runtime_on_a_path_a_live_runtime_holds_is_a_clear_error(tmp_path):
    path = tmp_path / "store"
    rt = incr.Runtime(store=path)
    add = _make_add(rt.input("x", 1))
    with rt:
        assert add(1) == 2
    with pytest.raises(incr.StoreError) as excinfo:
        incr.Runtime(store=path)
    msg = str(excinfo.value)
    assert str(path) in msg and "already open in this process" in msg and ".close()" in msg, msg
    with rt:                                  # the first one is untouched
        assert add(2) == 3
    rt.close()
    rt2 = incr.Runtime(store=path)            # and once closed, the path is free
    rt2.close()


def _forgotten_runtime(path):
    """A runtime, used and then dropped without close(): its inputs and cells refer back to
    it, so only the cycle collector can free it (the notebook cell run a second time)."""
    rt = incr.Runtime(store=path)
    add = _make_add(rt.input("x", 1))
    with rt:
        assert add(1) == 2
    return [s for s in store_mod._live if s.path == str(path)]


def test_second_runtime_takes_over_from_a_dropped_one(tmp_path):
    import weakref
    path = tmp_path / "store"
    gc.disable()                              # the drop must not be collected before the open
    try:
        stores = _forgotten_runtime(path)
        assert len(stores) == 1
        old = weakref.ref(stores[0])
        del stores
        assert old() is not None, "the dropped runtime was freed already: nothing to test"
        rt = incr.Runtime(store=path)
    finally:
        gc.enable()
    try:
        assert old() is None
        add = _make_add(rt.input("x", 1))
        _RAN.clear()
        with rt:
            assert add(1) == 2                # what the dropped one committed is there
        assert _RAN == [] and rt.stats()["store_hits"] == 1
    finally:
        rt.close()


# --- 16: compaction ---------------------------------------------------------------------------

@incr.cell(version="1")
def _bulky(k):
    return bytes([k % 256]) * 20_000


@incr.cell(version="1")
def _small(k):
    _RAN.append(f"small({k})")
    return k * 2


HOLD = r"""
import sys
import incr
rt = incr.Runtime(store=sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
rt.close()
"""


def test_gc_compact_shrinks_the_data_file_and_keeps_values(tmp_path):
    path = tmp_path / "store"
    rt = incr.Runtime(store=path)
    with rt:
        for k in range(200):
            _bulky(k)                         # about 4 MB, unreachable after the next run
        assert _small(1) == 2
    rt.close()
    rt = incr.Runtime(store=path)             # the latest run takes only _small(1)
    with rt:
        assert _small(1) == 2
    rt.close()
    data = path / "data.mdb"
    code, out, err = _cli("gc", path, "--json")
    assert code == 0 and json.loads(out)["dropped"] == 200, (out, err)
    before = data.stat().st_size                # gc alone frees pages, the file keeps them
    assert before > 4_000_000
    code, out, err = _cli("gc", path, "--compact", "--json")
    assert code == 0, err
    after = data.stat().st_size
    assert after < before // 10, (before, after)
    assert json.loads(out)["compacted"] == {"before": before, "after": after}
    assert stat.S_IMODE(data.stat().st_mode) == 0o600
    assert not [f for f in os.listdir(path) if f.startswith("data.mdb.")]
    _RAN.clear()
    rt = incr.Runtime(store=path)             # the values are still served
    with rt:
        assert _small(1) == 2
    assert _RAN == [] and rt.stats()["store_hits"] == 1
    rt.close()


@pytest.mark.hang_limit(120)
def test_gc_compact_is_refused_while_another_process_has_the_store_open(tmp_path):
    path = tmp_path / "store"
    rt = incr.Runtime(store=path)
    with rt:
        for k in range(50):
            _bulky(k)
    rt.close()
    data = path / "data.mdb"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        # (after the holder opened it: opening writes the run counter, which may grow it)
        before = (data.stat().st_ino, data.stat().st_size)
        code, out, err = _cli("gc", path, "--keep-runs", "5", "--compact")
        assert code == 1, (out, err)
        assert str(path) in err and "open in another process" in err, err
        assert "Traceback" not in err
        assert (data.stat().st_ino, data.stat().st_size) == before
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(60) == 0, holder.stderr.read()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    code, out, err = _cli("gc", path, "--keep-runs", "5", "--compact")
    assert code == 0, err
    assert data.stat().st_ino != before[0]
