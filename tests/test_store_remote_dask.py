"""The remote tier with the Dask executor (a real LocalCluster, a real redis-server): a driver
looks each stale instance up in its local store and then in the remote before it ships the
instance to a worker, so a second driver with an empty local store ships nothing — its
workers run no cell — and one input change ships only what it affects."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

distributed = pytest.importorskip("distributed")
redis = pytest.importorskip("redis", reason="the redis package (incr[redis]) is not installed")

import incr  # noqa: E402
from incr.adapters.dask import DaskExecutor  # noqa: E402

pytestmark = pytest.mark.hang_limit(300)

REDIS_SERVER = shutil.which("redis-server")


@pytest.fixture
def server(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; "
                    ".ci/run installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = redis.Redis(port=port)
    for _ in range(200):
        try:
            c.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def graph(rt, ran_file, n=6):
    x = rt.input("x", 1)
    y = rt.input("y", 10)

    @incr.cell(version="1")
    def work(i):
        with open(ran_file, "a") as f:
            f.write(f"work({i}) {os.getpid()}\n")
        v = x.get() * 100 + i
        if i % 2:
            v += y.get()
        return v

    @incr.cell(version="1", local=True)
    def total():
        with open(ran_file, "a") as f:
            f.write(f"total() {os.getpid()}\n")
        return sum(work(i) for i in range(n))

    return x, y, total


def ran(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [line.split()[0] for line in f]
    os.remove(path)
    return sorted(lines)


def test_a_second_driver_ships_nothing_to_its_workers(client, server, tmp_path):
    log = str(tmp_path / "ran")
    rt = incr.Runtime(store=tmp_path / "a", remote=server, executor=DaskExecutor(client))
    x, y, total = graph(rt, log)
    with rt:
        assert rt.observe(total).value == 6 * 100 + 15 + 30
    rt.close()
    assert ran(log) == sorted(["total()"] + [f"work({i})" for i in range(6)])

    rt = incr.Runtime(store=tmp_path / "b", remote=server, executor=DaskExecutor(client))
    x, y, total = graph(rt, log)
    with rt:
        obs = rt.observe(total)
        assert obs.value == 6 * 100 + 15 + 30
        assert ran(log) == []                   # neither the driver nor a worker ran a cell
        y.set(20)                               # only the odd work(i) read y
        rt.stabilize()
        assert obs.value == 6 * 100 + 15 + 60
        assert ran(log) == ["total()", "work(1)", "work(3)", "work(5)"]
    rt.close()
