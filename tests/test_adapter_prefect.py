"""incr.adapters.prefect: incr's content key as a Prefect 3 cache policy, and tasks that run as
incr cells, tested with real flow runs on Prefect's local ephemeral API (a temporary server
and SQLite database; no cloud, nothing written under ~/.prefect).

Task bodies count their executions in ``RAN``; the tests assert what ran, not only values.
The pipeline's functions live at module level so that a child process (the killed worker)
gives them the same identity as this one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
import warnings
from collections import Counter
from pathlib import Path

import pytest

# Prefect reads its settings when first imported: point its home at a temporary directory
# first, so that nothing (profiles, result storage, the test database) lands in ~/.prefect.
# A child process started by these tests inherits the same home through the environment.
_HOME = os.environ.get("INCR_TEST_PREFECT_HOME") or tempfile.mkdtemp(prefix="incr-prefect-")
os.environ.update({
    "INCR_TEST_PREFECT_HOME": _HOME,
    "PREFECT_HOME": _HOME,
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_TO_API_ENABLED": "false",
    # background services of the test server that no test here needs (a faster start)
    **{f"PREFECT_SERVER_SERVICES_{s}_ENABLED": "false" for s in (
        "SCHEDULER", "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS",
        "REPOSSESSOR", "TRIGGERS", "DB_VACUUM", "EVENT_LOGGER")},
    "PREFECT_SERVER_UI_ENABLED": "false",
})

prefect = pytest.importorskip("prefect", reason="the Prefect adapter needs 'incr[prefect]'")

from incr.adapters.prefect import (  # noqa: E402
    INCR_KEY,
    IncrCachePolicy,
    cell_of,
    incremental_task,
    task_identity,
)
from prefect import flow, task  # noqa: E402 - after the settings above
from prefect.cache_policies import INPUTS, TASK_SOURCE  # noqa: E402

import incr  # noqa: E402

TESTS = Path(__file__).resolve().parent
RAN: Counter = Counter()        # task bodies count their executions here (a Counter is keyed
                                # by its type only, so it does not change the tasks' keys)


def _ran() -> Counter:
    out = Counter(RAN)
    RAN.clear()
    return out


# --- the pipeline: two loads, two scalings, one total -----------------------------------------


def _maybe_die(step: str) -> None:
    if os.environ.get("INCR_TEST_KILL_IN") == step:   # a worker killed mid-task
        os.kill(os.getpid(), signal.SIGKILL)


def load(n: int) -> list:
    RAN["load"] += 1
    return [float(i) for i in range(n)]


def scale(xs: list, k: float) -> list:
    RAN["scale"] += 1
    return [x * k for x in xs]


def total(a: list, b: list) -> float:
    RAN["total"] += 1
    _maybe_die("total")
    return sum(a) + sum(b)


def local(n: int, m: int, k: float) -> float:
    """The same computation without Prefect or incr: what every flow run must return (its
    executions are not counted)."""
    saved = Counter(RAN)
    try:
        return total(scale(load(n), 2.0), scale(load(m), k))
    finally:
        RAN.clear()
        RAN.update(saved)


def make_pipeline(kind: str, *, runtime=None, key_storage=None):
    """The pipeline as Prefect tasks: ``kind`` is "policy" (@task with incr's cache policy)
    or "incremental" (incremental_task on ``runtime``)."""
    if kind == "policy":
        policy = INCR_KEY if key_storage is None else INCR_KEY.configure(
            key_storage=Path(key_storage))
        def wrap(f):
            return task(f, cache_policy=policy, result_serializer="json")
    else:
        def wrap(f):
            return incremental_task(f, runtime=runtime)
    t_load, t_scale, t_total = wrap(load), wrap(scale), wrap(total)

    @flow(name=f"pipeline-{kind}")
    def pipeline(n: int, m: int, k: float) -> float:
        return t_total(t_scale(t_load(n), 2.0), t_scale(t_load(m), k))

    return pipeline


def _child(kind: str, path: str) -> None:
    """Run the pipeline in this (child) process; INCR_TEST_KILL_IN kills it mid-task."""
    if kind == "policy":
        make_pipeline("policy", key_storage=path)(3, 4, 2.0)
    else:
        make_pipeline("incremental", runtime=path)(3, 4, 2.0)


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefect_api():
    """Prefect's own local ephemeral API (a temporary server on SQLite), once per module."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="module", autouse=True)
def _prefect_home():
    """Remove the temporary Prefect home when this module's tests are done (whichever ran)."""
    yield _HOME
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_counts():
    RAN.clear()
    yield
    RAN.clear()


def _ctx(t):
    """What Prefect passes to compute_key, as far as the key policies read it."""
    return types.SimpleNamespace(task=t)


def _keys(policy, t, **params):
    return policy.compute_key(_ctx(t), params, {})


# --- the key: what TASK_SOURCE misses ---------------------------------------------------------


def _make_scaler(k):
    def scaled(x: float) -> float:
        return x * k
    return task(scaled)


def _make_limited(limit):
    def limited(xs: list, n: int = limit) -> list:
        return xs[:n]
    return task(limited)


THRESHOLD = 10


def _norm(x):
    return x


def _norm_v2(x):
    return -x


def above(xs: list) -> list:
    RAN["above"] += 1
    return [_norm(x) for x in xs if x > THRESHOLD]


def test_same_source_different_closure_or_defaults():
    # tasks made by a factory: the same source text, different behaviour
    two, three = _make_scaler(2), _make_scaler(3)
    assert _keys(TASK_SOURCE, two) == _keys(TASK_SOURCE, three)
    assert _keys(TASK_SOURCE + INPUTS, two, x=1.0) == _keys(TASK_SOURCE + INPUTS, three, x=1.0)
    assert _keys(INCR_KEY, two, x=1.0) != _keys(INCR_KEY, three, x=1.0)
    assert _keys(INCR_KEY, two, x=1.0) == _keys(INCR_KEY, _make_scaler(2), x=1.0)  # stable
    # a default value bound at definition time: same text `n: int = limit`
    five, six = _make_limited(5), _make_limited(6)
    assert _keys(TASK_SOURCE, five) == _keys(TASK_SOURCE, six)
    assert _keys(INCR_KEY, five, xs=[1]) != _keys(INCR_KEY, six, xs=[1])


def test_module_constants_and_callees_are_part_of_the_key(monkeypatch):
    t = task(above)
    before = (_keys(TASK_SOURCE, t), _keys(INCR_KEY, t, xs=[1, 20]))
    monkeypatch.setattr(sys.modules[__name__], "THRESHOLD", 15)   # a config constant edited
    with pytest.warns(incr.NotPersistableWarning, match="THRESHOLD, whose value changed"):
        after = (_keys(TASK_SOURCE, t), _keys(INCR_KEY, t, xs=[1, 20]))
    assert before[0] == after[0] and before[1] != after[1]
    monkeypatch.setattr(sys.modules[__name__], "THRESHOLD", 10)
    assert _keys(INCR_KEY, t, xs=[1, 20]) == before[1]
    monkeypatch.setattr(sys.modules[__name__], "_norm", _norm_v2)  # a helper's body edited
    assert _keys(TASK_SOURCE, t) == before[0]
    assert _keys(INCR_KEY, t, xs=[1, 20]) != before[1]
    # follow_globals=False keys on the task's own code and closure only (incr's cell identity)
    shallow = IncrCachePolicy(follow_globals=False)
    k = _keys(shallow, t, xs=[1, 20])
    monkeypatch.setattr(sys.modules[__name__], "_norm", _norm)
    assert _keys(shallow, t, xs=[1, 20]) == k


def test_incremental_task_store_entries_follow_module_constants(monkeypatch, tmp_path):
    # each "process" builds its tasks afresh (as an import would) and opens the store; the
    # runner (t.fn) is what Prefect calls, so no flow is needed to check what runs
    store = str(tmp_path / "store")

    def process():
        rt = incr.Runtime(store=store)
        try:
            return incremental_task(above, runtime=rt).fn([1, 12, 20]), _ran()
        finally:
            rt.close()

    assert process() == ([12, 20], Counter(above=1))
    assert process() == ([12, 20], Counter())                # taken from the store
    monkeypatch.setattr(sys.modules[__name__], "THRESHOLD", 15)
    assert process() == ([20], Counter(above=1))             # the edit invalidates it
    assert process() == ([20], Counter())


def _make_llm(validator_version, shout=True):
    @incr.validator(version=validator_version)
    def nonempty(candidate, request):
        yield incr.ACK("nonempty") if candidate else incr.NACK("nonempty")

    @incr.llm(validators=[nonempty])
    def summarize(request: str, *, previous=None, feedback=()) -> str:
        return request.upper() if shout else request.lower()

    return summarize


def _make_llm_caller(node):
    def answer(question: str) -> str:
        return node(question)
    return task(answer)


def test_llm_task_key_includes_validator_versions():
    v1, v2 = _make_llm("1"), _make_llm("2")
    # Prefect cannot make a task of an LLM node itself (not a plain function), but
    # incremental_task can; Prefect's TASK_SOURCE then finds the source of incr's own wrapper,
    # the same for every LLM node, while incr's key has the node's identity and validators
    def as_task(node):
        return incremental_task(node)
    assert _keys(TASK_SOURCE, as_task(v1)) == _keys(TASK_SOURCE, as_task(v2))
    assert (_keys(TASK_SOURCE, as_task(v1))
            == _keys(TASK_SOURCE, as_task(_make_llm("1", shout=False))))
    assert _keys(INCR_KEY, as_task(v1), request="q") != _keys(INCR_KEY, as_task(v2), request="q")
    assert (_keys(INCR_KEY, as_task(v1), request="q")
            == _keys(INCR_KEY, as_task(_make_llm("1")), request="q"))
    assert (_keys(INCR_KEY, as_task(v1), request="q")
            != _keys(INCR_KEY, as_task(_make_llm("1", shout=False)), request="q"))
    # a plain task that calls the node: the node's identity, validators included, is in its key
    c1, c2 = _make_llm_caller(v1), _make_llm_caller(v2)
    assert _keys(TASK_SOURCE, c1) == _keys(TASK_SOURCE, c2)
    assert _keys(INCR_KEY, c1, question="q") != _keys(INCR_KEY, c2, question="q")
    assert task_identity(c1) != task_identity(c2)


def test_key_is_incr_canonical_encoding():
    t = task(scale)
    k = {repr(x): _keys(INCR_KEY, t, xs=[x], k=2.0) for x in (1, 1.0, True)}
    assert len(set(k.values())) == 3, "1, 1.0 and True are three keys"
    assert _keys(INCR_KEY, t, xs=[1], k=2.0) != _keys(INCR_KEY, t, xs=(1,), k=2.0)
    assert _keys(INPUTS, t, xs=[1], k=2.0) == _keys(INPUTS, t, xs=(1,), k=2.0)  # JSON: both [1]
    assert _keys(INCR_KEY, t, xs=[1], k=2.0) == _keys(INCR_KEY, t, k=2.0, xs=[1])
    d = task(total)
    assert (_keys(INCR_KEY, d, a={"x": 1, "y": 2}, b=[])
            == _keys(INCR_KEY, d, a={"y": 2, "x": 1}, b=[]))


def test_what_cannot_be_keyed_is_not_cached_with_a_warning():
    with pytest.warns(incr.NotPersistableWarning, match=r"argument xs is an object, .*register_type"):
        assert _keys(INCR_KEY, task(scale), xs=object(), k=1.0) is None

    lock = object()

    def guarded(x: int) -> int:
        return hash(lock) + x
    with pytest.warns(incr.NotPersistableWarning, match=r"closure variable lock.*version"):
        assert _keys(INCR_KEY, task(guarded), x=1) is None
    async def fetch(x: int) -> int:
        return x

    def rows(n: int):
        yield from range(n)
    for f in (fetch, rows):
        with pytest.raises(TypeError, match="cannot be reused"):
            incremental_task(f)
    # with a version the user names the definition, and takes responsibility for it
    assert _keys(IncrCachePolicy(version="1"), task(guarded), x=1) is not None
    assert (_keys(IncrCachePolicy(version="1"), task(guarded), x=1)
            != _keys(IncrCachePolicy(version="2"), task(guarded), x=1))


# --- real flow runs ----------------------------------------------------------------------------


def test_policy_flow_runs_only_what_changed(prefect_api, tmp_path):
    pipeline = make_pipeline("policy", key_storage=tmp_path / "keys")
    assert pipeline(3, 4, 2.0) == local(3, 4, 2.0)
    assert _ran() == Counter(load=2, scale=2, total=1)
    assert pipeline(3, 4, 2.0) == local(3, 4, 2.0)
    assert _ran() == Counter()
    assert pipeline(3, 4, 5.0) == local(3, 4, 5.0)      # one parameter changed
    assert _ran() == Counter(scale=1, total=1)
    assert pipeline(3, 5, 5.0) == local(3, 5, 5.0)
    assert _ran() == Counter(load=1, scale=1, total=1)


def test_incremental_flow_runs_only_what_changed(prefect_api):
    rt = incr.Runtime()
    pipeline = make_pipeline("incremental", runtime=rt)
    assert pipeline(3, 4, 2.0) == local(3, 4, 2.0)
    assert _ran() == Counter(load=2, scale=2, total=1)
    assert pipeline(3, 4, 2.0) == local(3, 4, 2.0)
    assert _ran() == Counter()
    assert pipeline(3, 4, 5.0) == local(3, 4, 5.0)
    assert _ran() == Counter(scale=1, total=1)
    assert pipeline(3, 5, 5.0) == local(3, 5, 5.0)
    assert _ran() == Counter(load=1, scale=1, total=1)
    rt._check()


def test_incremental_tasks_follow_incr_inputs_and_run_concurrently(prefect_api):
    rt = incr.Runtime()
    rate = rt.input("rate", 0.1)

    def fee(amount: float) -> float:
        RAN["fee"] += 1
        return round(amount * rate.get(), 6)

    t_load, t_fee = incremental_task(load, runtime=rt), incremental_task(fee, runtime=rt)

    @flow
    def billing(sizes: list) -> list:
        futures = [t_load.submit(n) for n in sizes]      # threads, one runtime
        again = t_load(sizes[0])                          # the same call within the run
        assert again == futures[0].result()
        return [t_fee(sum(f.result())) for f in futures]

    sizes = [3, 4, 5, 6]
    expected = [round(sum(range(n)) * 0.1, 6) for n in sizes]
    assert billing(sizes) == expected
    assert _ran() == Counter(load=4, fee=4)
    rate.set(0.2)   # not a Prefect parameter: Prefect's cache policies cannot see it
    assert billing(sizes) == [round(sum(range(n)) * 0.2, 6) for n in sizes]
    assert _ran() == Counter(fee=4)
    rt._check()
    assert "rate" in rt.explain(cell_of(t_fee), float(sum(range(3))))


def test_an_incremental_task_called_in_another_is_its_dependency(prefect_api):
    rt = incr.Runtime()
    unit = rt.input("unit", "kg")

    def label(x: int) -> str:
        RAN["label"] += 1
        return f"{x} {unit.get()}"

    t_label = incremental_task(label, runtime=rt)

    def sheet(xs: list) -> list:
        RAN["sheet"] += 1
        return [t_label(x) for x in xs]          # nested task runs: dependencies in incr

    t_sheet = incremental_task(sheet, runtime=rt)

    @flow
    def report_flow(xs: list) -> list:
        return t_sheet(xs)

    assert report_flow([1, 2]) == ["1 kg", "2 kg"] and _ran() == Counter(sheet=1, label=2)
    assert report_flow([1, 2]) == ["1 kg", "2 kg"] and _ran() == Counter()
    unit.set("lb")
    assert report_flow([1, 2]) == ["1 lb", "2 lb"] and _ran() == Counter(sheet=1, label=2)
    rt._check()


def test_incremental_flow_with_a_store_runs_nothing_the_second_time(prefect_api, tmp_path):
    store = str(tmp_path / "store")
    rt = incr.Runtime(store=store)
    assert make_pipeline("incremental", runtime=rt)(3, 4, 2.0) == local(3, 4, 2.0)
    assert _ran() == Counter(load=2, scale=2, total=1)
    rt.close()
    rt = incr.Runtime(store=store)   # another flow run, as another process would see it
    assert make_pipeline("incremental", runtime=rt)(3, 4, 2.0) == local(3, 4, 2.0)
    assert _ran() == Counter()
    assert rt.stats()["store_hits"] >= 1 and rt.stats()["computed"] == 0
    make_pipeline("incremental", runtime=rt)(3, 4, 5.0)
    assert _ran() == Counter(scale=1, total=1)
    rt._check()
    rt.close()


def _make_titler(validator_version):
    @incr.validator(version=validator_version)
    def short(candidate, request):
        yield incr.ACK("short") if len(candidate) < 40 else incr.NACK("short")

    @incr.llm(validators=[short])
    def title(request: str, *, previous=None, feedback=()) -> str:
        RAN["generate"] += 1              # stands for a model call
        return request.title()

    return incremental_task(title)        # runtime=None: the runtime active around the flow


def test_llm_node_as_incremental_task_across_flow_runs(prefect_api, tmp_path):
    store = str(tmp_path / "store")

    def flow_run(validator_version):     # a new process: new task objects, a new runtime
        t = _make_titler(validator_version)

        @flow
        def titles(requests: list) -> list:
            return [t(r) for r in requests]

        rt = incr.Runtime(store=store)
        try:
            with rt:
                return titles(["a b", "c d", "a b"]), _ran()["generate"]
        finally:
            rt.close()

    assert flow_run("1") == (["A B", "C D", "A B"], 2)
    assert flow_run("1") == (["A B", "C D", "A B"], 0)    # accepted candidates, from the store
    assert flow_run("2") == (["A B", "C D", "A B"], 2)    # a validator bumped: generate again


def test_a_failing_task_keeps_nothing_partial_and_retries_run_it_again(prefect_api):
    rt = incr.Runtime()
    attempts = []

    def flaky(x: int) -> int:
        attempts.append(x)
        if len(attempts) == 1:
            raise ConnectionError("worker lost")
        return x * 2

    t = incremental_task(flaky, runtime=rt, retries=1)

    @flow
    def once(x: int) -> int:
        return t(x)

    assert once(21) == 42 and attempts == [21, 21]
    assert once(21) == 42 and attempts == [21, 21]
    rt._check()


@pytest.mark.parametrize("kind", ["incremental", "policy"])
def test_a_killed_worker_leaves_store_and_trace_usable(prefect_api, tmp_path, kind):
    path = str(tmp_path / ("store" if kind == "incremental" else "keys"))
    # the child imports this module under the name it has here, so that its tasks have the
    # same identities (module and qualified name) as the parent's
    env = dict(os.environ, PREFECT_API_URL=prefect_api, INCR_TEST_KILL_IN="total",
               PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS),
                                           os.environ.get("PYTHONPATH", "")]))
    child = subprocess.run(
        # (conftest first: it maps incr.adapters to this checkout's adapters/, as in the parent)
        [sys.executable, "-c", ("import importlib, sys, conftest; "
                                "importlib.import_module(sys.argv[1])"
                                "._child(sys.argv[2], sys.argv[3])"),
         __name__, kind, path],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    with warnings.catch_warnings():
        warnings.simplefilter("error", incr.NotPersistableWarning)
        if kind == "incremental":
            from incr.store import DamagedRecordWarning
            warnings.simplefilter("error", DamagedRecordWarning)
            rt = incr.Runtime(store=path)
            pipeline = make_pipeline("incremental", runtime=rt)
        else:
            pipeline = make_pipeline("policy", key_storage=path)
        # the tasks that finished before the kill are not run again; the killed one is
        assert pipeline(3, 4, 2.0) == local(3, 4, 2.0)
        assert _ran() == Counter(total=1)
        assert pipeline(3, 4, 2.0) == local(3, 4, 2.0)
        assert _ran() == Counter()
    if kind == "incremental":
        rt._check()
        rt.close()
