"""The remote tier (incr.tiers) against a real redis-server: two machines sharing results, LLM
node state shared only in the same context, a remote killed mid-run, stopped (timeouts),
damaged records, a full remote. Each test counts what was computed, not only values."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import incr
from incr.tiers import RemoteTierWarning

redis = pytest.importorskip("redis", reason="the redis package (incr[redis]) is not installed")

REDIS_SERVER = shutil.which("redis-server")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp, *extra):
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        for _ in range(200):
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    raise RuntimeError("redis-server exited at start")
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer")

    def keys(self, kind: bytes = b"") -> list[bytes]:
        return sorted(self.client.keys(b"incr:3:" + kind + b"*"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; "
                    ".ci/run installs it)")
    d = tmp_path / "redis"
    d.mkdir()
    s = Server(d)
    try:
        yield s
    finally:
        try:
            os.kill(s.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        s.kill()


MACHINE = r'''
import json, sys
import incr
path, url, x0, n = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), int(sys.argv[4])
close = sys.argv[5] == "close"
rt = incr.Runtime(store=path, remote=url)
x = rt.input("x", x0)
ran = []

@incr.cell(version="1")
def leaf(i):
    ran.append(f"leaf({i})")
    return x.get() * i

@incr.cell(version="1")
def total():
    ran.append("total()")
    return sum(leaf(i) for i in range(n))

with rt:
    value = total()
s = rt.stats()
if close:
    rt.close()      # (otherwise: at exit, the buffered commit and the remote's queue)
print(json.dumps({"value": value, "ran": ran, "hits": s["store_hits"]}))
'''


def _machine(tmp_path, store, url, x=3, n=50, close=True):
    prog = tmp_path / "machine.py"
    prog.write_text(MACHINE)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-W", "error::incr.tiers.RemoteTierWarning",
                          str(prog), str(tmp_path / store), url or "", str(x), str(n),
                          "close" if close else "exit"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_a_second_machine_computes_nothing(tmp_path, server):
    a = _machine(tmp_path, "a", server.url)
    assert a["value"] == 3 * sum(range(50)) and len(a["ran"]) == 51
    assert server.keys(b"e")                            # pushed: entries ...
    assert server.keys(b"x")                            # ... and their index
    b = _machine(tmp_path, "b", server.url)             # another local store, same remote
    assert b == {"value": a["value"], "ran": [], "hits": 51}
    # what the remote gave is in b's local store now: no remote needed
    assert _machine(tmp_path, "b", None)["ran"] == []
    # another input value: a different trace, computed
    c = _machine(tmp_path, "c", server.url, x=4)
    assert c["value"] == 4 * sum(range(50)) and len(c["ran"]) == 51
    # without the remote, a third store computes everything (the test can fail)
    assert len(_machine(tmp_path, "d", None)["ran"]) == 51


LLM_MACHINE = r'''
import json, sys
import incr
path, url, topic0 = sys.argv[1], sys.argv[2] or None, sys.argv[3]
rt = incr.Runtime(store=path, remote=url)
topic = rt.input("topic", topic0)
calls = []

@incr.validator(version="1")
def mentions(candidate, i):
    if topic.get() in candidate:
        return incr.ACK("mentions")
    return incr.NACK("mentions", message="mention the topic")

@incr.llm(version="1", validators=[mentions])
def summary(i, *, previous=None, feedback=()):
    calls.append(topic.get())
    if not feedback:
        return f"draft {i}"
    return f"{topic.get()} summary {i}"

with rt:
    value = summary(7)
st = rt.state(summary, 7)
rt.close()
print(json.dumps({"value": value, "calls": calls, "status": st.status,
                  "revision": st.revision, "checks": len(st.checks)}))
'''


def test_a_machine_that_exits_without_close_still_pushes(tmp_path, server):
    a = _machine(tmp_path, "a", server.url, n=30, close=False)
    assert len(a["ran"]) == 31
    assert _machine(tmp_path, "b", server.url, n=30)["ran"] == []


def test_an_accepted_llm_candidate_is_shared_only_in_the_same_context(tmp_path, server):
    prog = tmp_path / "llm.py"
    prog.write_text(LLM_MACHINE)
    env = dict(os.environ, PYTHONPATH=ROOT)

    def run(store, topic, url=server.url):
        out = subprocess.run([sys.executable, str(prog), str(tmp_path / store), url,
                              topic], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[-1])

    a = run("a", "tides")
    assert a["value"] == "tides summary 7" and a["calls"] == ["tides", "tides"]
    assert a["revision"] == 2 and a["checks"] >= 2       # a NACK on 1, an ACK on 2
    assert server.keys(b"n")                              # the node's state was pushed
    b = run("b", "tides")                                 # same context, another machine
    assert b["value"] == a["value"] and b["calls"] == []
    # its state came with it: the revision and the verdicts of machine a
    assert (b["status"], b["revision"], b["checks"]) == ("stable", 2, a["checks"])
    c = run("c", "moons")                                 # another context: generated anew
    assert c["value"] == "moons summary 7" and c["calls"] and set(c["calls"]) == {"moons"}
    # ... as machine a itself does with its own saved state (which c took from the remote)
    again = run("a", "moons", url="")
    assert (again["value"], again["calls"]) == (c["value"], c["calls"])


def _remote_stats(path):
    from incr.store import _live
    (s,) = [s for s in list(_live) if s.path == str(path)]
    return s.remote.stats


def _cells(ran):
    @incr.cell(version="1")
    def leaf(i):
        ran.append(i)
        return bytes([i % 256]) * 64

    return leaf


def _fill(tmp_path, server, n=40):
    """Machine a computes leaf(0..n) into the remote; returns the cell."""
    ran = []
    leaf = _cells(ran)
    rt = incr.Runtime(store=tmp_path / "a", remote=server.url)
    with rt:
        for i in range(n):
            leaf(i)
    rt.close()
    assert len(ran) == n and len(server.keys(b"e")) == n
    return leaf, ran


def test_the_remote_killed_mid_run_is_one_warning_and_local_computation(tmp_path, server):
    leaf, ran = _fill(tmp_path, server)
    ran.clear()
    rt = incr.Runtime(store=tmp_path / "b", remote=server.url)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with rt:
            for i in range(20):
                assert leaf(i) == bytes([i]) * 64
            assert ran == []                       # all 20 from the remote
            server.kill()
            for i in range(20, 40):
                assert leaf(i) == bytes([i]) * 64
        rt.close()                                 # never raises: what waits stays local
    assert ran == list(range(20, 40))
    remote = [x for x in w if issubclass(x.category, RemoteTierWarning)]
    assert len(remote) == 1, [str(x.message) for x in w]
    assert "reading failed" in str(remote[0].message) and "tried again" in str(remote[0].message)
    assert not [x for x in w if not issubclass(x.category, RemoteTierWarning)]
    # b's local store has all 40 (20 taken from the remote, 20 computed)
    ran.clear()
    rt = incr.Runtime(store=tmp_path / "b")
    with rt:
        for i in range(40):
            assert leaf(i) == bytes([i]) * 64
    rt.close()
    assert ran == []


def test_a_warm_start_takes_a_round_trip_per_level(tmp_path, server):
    """The bundles: machine b's lookups of a root over 60 leaves (each reading an input) ask
    the remote once for the root and once for all the leaves, not once per index node."""
    ran = []

    def build(rt):
        xs = [rt.input(f"x{i}", i) for i in range(60)]

        @incr.cell(version="1")
        def leaf(i):
            ran.append(i)
            return xs[i].get() * 2

        @incr.cell(version="1")
        def root():
            ran.append("root")
            return sum(leaf(i) for i in range(60))
        return root

    for store in ("a", "b"):
        rt = incr.Runtime(store=tmp_path / store, remote=server.url)
        root = build(rt)
        with rt:
            assert root() == 2 * sum(range(60))
        rt.close()
    assert ran == ["root"] + list(range(60))          # b computed nothing
    stats = _remote_stats(tmp_path / "b")
    assert stats["round_trips"] == 2 and stats["found"] >= 61, stats


def test_blake2b_stores_share_through_the_remote_and_never_mix_with_xxh3(tmp_path, server):
    ran = []
    leaf = _cells(ran)
    for store, hash_ in (("a", "blake2b"), ("b", "blake2b"), ("c", "xxh3_128")):
        rt = incr.Runtime(store=tmp_path / store, remote=server.url, hash=hash_)
        with rt:
            assert [leaf(i) for i in range(5)] == [bytes([i]) * 64 for i in range(5)]
        rt.close()
    # a computed, b took a's results, c (another algorithm: other keys) computed again
    assert ran == list(range(5)) * 2
    assert {k[8:9] for k in server.keys(b"e")} == {b"b", b"x"}


def test_a_remote_down_from_the_start(tmp_path):
    ran = []
    leaf = _cells(ran)
    rt = incr.Runtime(store=tmp_path / "a", remote=f"redis://127.0.0.1:{_free_port()}/0")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with rt:
            assert [leaf(i) for i in range(5)] == [bytes([i]) * 64 for i in range(5)]
        rt.close()
    assert ran == list(range(5))
    assert [issubclass(x.category, RemoteTierWarning) for x in w] == [True]


def test_a_stopped_remote_times_out(tmp_path, server):
    """A server that accepts nothing more (SIGSTOP): each lookup would wait; the first waits
    the timeout (0.2 s here), then the remote is left alone: one warning."""
    leaf, ran = _fill(tmp_path, server, n=10)
    ran.clear()
    rt = incr.Runtime(store=tmp_path / "b", remote=server.url + "?socket_timeout=0.2")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with rt:
            assert leaf(0) == bytes([0]) * 64       # (connected, from the remote)
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                assert [leaf(i) for i in range(1, 10)] == [bytes([i]) * 64
                                                           for i in range(1, 10)]
            finally:
                rt.close()
                os.kill(server.proc.pid, signal.SIGCONT)
    assert ran == list(range(1, 10))
    remote = [str(x.message) for x in w if issubclass(x.category, RemoteTierWarning)]
    assert len(remote) == 1 and "Timeout" in remote[0], remote
    assert _remote_stats(tmp_path / "b")["failures"] == 1


def _damage(server, how, kinds):
    c = server.client
    keys = [k for kind in kinds for k in server.keys(kind)]
    vals = c.mget(keys)
    if how == "swap":   # sound records under each other's keys (a content address mismatch)
        for kd in (b"e", b"x", b"n", b"b"):
            ks = [k for k in keys if k[7:8] == kd]
            for k, k2 in zip(ks, ks[1:] + ks[:1]):
                c.set(k, vals[keys.index(k2)])
        return
    for k, v in zip(keys, vals):
        if how == "flip":
            v = v[:len(v) // 2] + bytes([v[len(v) // 2] ^ 0x40]) + v[len(v) // 2 + 1:]
        elif how == "truncate":
            v = v[:len(v) - 3]
        elif how == "garbage":
            v = os.urandom(len(v))
        c.set(k, v)


@pytest.mark.parametrize("kind", [(b"e", b"b"), (b"",)], ids=["entries", "everything"])
@pytest.mark.parametrize("how", ["flip", "truncate", "garbage", "swap"])
def test_damaged_remote_records_are_misses(tmp_path, server, how, kind):
    leaf, ran = _fill(tmp_path, server, n=12)
    _damage(server, how, kind)
    ran.clear()
    rt = incr.Runtime(store=tmp_path / "b", remote=server.url)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with rt:
            for i in range(12):
                assert leaf(i) == bytes([i]) * 64
        rt.close()
    assert sorted(ran) == list(range(12))          # every one computed: nothing was taken
    remote = [str(x.message) for x in w if issubclass(x.category, RemoteTierWarning)]
    assert len(remote) <= 1, remote
    assert len(w) == len(remote), [str(x.message) for x in w]
    if kind != (b"",):
        # entries and bundles (which hold entries) damaged: the index led to each entry,
        # which failed its checks: one warning for them all
        assert len(remote) == 1 and "damaged record" in remote[0]
        assert _remote_stats(tmp_path / "b")["damaged"] >= 12
    # (a damaged index node may parse and lead nowhere: a plain miss)
    # b pushed its records: the remote is repaired for the next machine
    ran.clear()
    rt = incr.Runtime(store=tmp_path / "c", remote=server.url)
    with rt:
        assert [leaf(i) for i in range(12)] == [bytes([i]) * 64 for i in range(12)]
    rt.close()
    assert ran == []


def test_a_full_remote_refuses_writes_with_one_warning(tmp_path, server):
    server.client.config_set("maxmemory-policy", "noeviction")
    server.client.config_set("maxmemory", "1")          # every write is refused (OOM)
    ran = []
    leaf = _cells(ran)
    rt = incr.Runtime(store=tmp_path / "a", remote=server.url)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with rt:
            for i in range(30):
                assert leaf(i) == bytes([i]) * 64
            rt._commit()                                   # pushed now: refused
            for i in range(30, 60):
                assert leaf(i) == bytes([i % 256]) * 64
        rt.close()
    remote = [str(x.message) for x in w if issubclass(x.category, RemoteTierWarning)]
    assert len(remote) == 1 and "writing failed" in remote[0] and "maxmemory" in remote[0], remote
    assert ran == list(range(60)) and server.keys() == []
    ran.clear()
    rt = incr.Runtime(store=tmp_path / "a")                # all of it is in the local store
    with rt:
        assert [leaf(i) for i in range(60)] == [bytes([i]) * 64 for i in range(60)]
    rt.close()
    assert ran == []


def test_remote_records_are_checked_by_content(tmp_path, server):
    """An entry read from the remote must hash to its own key: a sound record of another
    instance, re-checksummed, is refused (store-level check, no lookup involved)."""
    from incr.store import _check_remote, pack_record, unpack_record

    leaf, _ran = _fill(tmp_path, server, n=2)
    (k0, k1) = [k[8:] for k in server.keys(b"e")]
    v0, v1 = server.client.mget([b"incr:3:e" + k0, b"incr:3:e" + k1])
    assert unpack_record(_check_remote(b"e", k0, v0, 99))["run"] == 99
    with pytest.raises(ValueError, match="not those of its key"):
        _check_remote(b"e", k0, v1, 1)
    rec = unpack_record(v0)
    rec["val"] = rec["val"][:-1] + b"\x01"               # a value that is not the one hashed
    with pytest.raises(ValueError, match="does not hash"):
        _check_remote(b"e", k0, pack_record(rec), 1)


def test_a_bad_remote_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="unknown kind of remote tier"):
        incr.Runtime(store=tmp_path / "s", remote="s3://bucket/x")
    with pytest.raises(TypeError, match="get_many, put_many and close"):
        incr.Runtime(store=tmp_path / "t", remote=42)
    # the store was not left open by the refused runtime
    incr.Runtime(store=tmp_path / "s").close()


def test_another_backend_behind_the_interface(tmp_path):
    """The interface is get_many / put_many / close: a dict-backed tier shares results."""
    class DictTier:
        def __init__(self):
            self.d = {}

        def get_many(self, keys):
            return [self.d.get(k) for k in keys]

        def put_many(self, items):
            self.d.update(items)

        def close(self):
            pass

    tier = DictTier()
    ran = []
    leaf = _cells(ran)
    for store in ("a", "b"):
        rt = incr.Runtime(store=tmp_path / store, remote=tier)
        with rt:
            assert [leaf(i) for i in range(5)] == [bytes([i]) * 64 for i in range(5)]
        rt.close()
    assert ran == list(range(5)) and len(tier.d) >= 10


def test_the_remote_tiers_counters_are_in_rt_stats(tmp_path, server):
    """rt.stats() reports the remote tier: records it had (and passed the checks), keys it
    did not have, failures, records pushed. Without a remote they are all 0."""
    leaf, ran = _fill(tmp_path, server, n=10)
    ran.clear()
    rt = incr.Runtime(store=tmp_path / "b", remote=server.url)
    with rt:
        for i in range(10):
            leaf(i)                       # from the remote
        before = rt.stats()
        assert before["remote_hits"] >= 10 and before["remote_errors"] == 0
        assert before["remote_pushed"] == 0
        leaf(999)                         # asked, not there: computed, then pushed
    rt.close()
    s = rt.stats()
    assert ran == [999]
    assert s["remote_misses"] > before["remote_misses"]
    assert s["remote_pushed"] >= 1 and s["remote_errors"] == 0
    assert s["store_hits"] == 10
    server.kill()
    rt = incr.Runtime(store=tmp_path / "c", remote=server.url)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with rt:
            leaf(1000)
        rt.close()
    assert rt.stats()["remote_errors"] >= 1
    rt = incr.Runtime(store=tmp_path / "d")
    with rt:
        leaf(1)
    rt.close()
    assert {k: v for k, v in rt.stats().items() if k.startswith("remote_")} == {
        "remote_hits": 0, "remote_misses": 0, "remote_errors": 0, "remote_pushed": 0,
        "remote_dropped": 0}
