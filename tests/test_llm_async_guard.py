"""A coroutine is never a candidate or a verdict: ``@incr.llm``, ``@incr.validator`` (and
``recheck=``) refuse async functions when they are defined, and ``chat_generator`` refuses an
async client (this version runs sync generators and validators only). At call time, a sync
generator that returns an awaitable ends the node with a TypeError naming it, keeping nothing
(no candidate, no verdict, one call spent); a sync validator that returns or yields an
awaitable gives an UNKNOWN whose reason names it. Every awaitable met is closed: no "never
awaited" warning."""

from __future__ import annotations

import asyncio
import gc
import warnings
from contextlib import contextmanager

import inspect

import pytest

import incr


@contextmanager
def no_unawaited_warning():
    """Fails if a coroutine is dropped without being closed ("... was never awaited")."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
        gc.collect()
    bad = [str(w.message) for w in seen if "never awaited" in str(w.message)]
    assert not bad, bad


async def later(value):
    return value


class Later:
    """An awaitable that is not a coroutine."""

    def __await__(self):
        yield
        return "x"


# --- at definition ---------------------------------------------------------------------------


def test_llm_takes_a_coroutine_function_and_refuses_an_async_generator_function():
    async def write_sql(q, *, previous=None, feedback=()):
        await asyncio.sleep(0)
        return f"SELECT {q}"

    node = incr.llm(write_sql)
    with incr.Runtime() as rt:
        assert node(1) == "SELECT 1"            # sync code: awaited on a loop of incr's
    rt._check()

    async def stream_sql(q, *, previous=None, feedback=()):
        yield "SELECT 1"

    with pytest.raises(TypeError, match=r"stream_sql.* async generator function"):
        incr.llm(stream_sql)

    class AsyncModel:                       # a callable object whose __call__ is async
        async def __call__(self, q, *, previous=None, feedback=()):
            return "SELECT 2"

    model = incr.llm(version="m")(AsyncModel())
    with incr.Runtime():
        assert model(1) == "SELECT 2"

    # a sync generator that runs a coroutine to completion inside is fine
    @incr.llm(version="1")
    def sync_sql(q, *, previous=None, feedback=()):
        return asyncio.run(later(f"SELECT {q}"))

    with incr.Runtime() as rt:
        assert sync_sql(1) == "SELECT 1"
    rt._check()


def test_validator_takes_async_def_and_refuses_async_generator_functions_naming_them():
    async def runs_ok(candidate, q):
        await asyncio.sleep(0)
        return incr.NACK("runs", counterexample=candidate) if "bad" in candidate \
            else incr.ACK("runs")

    async def checks(candidate, q):
        yield incr.ACK("runs")

    v = incr.validator(runs_ok)
    assert v.is_async and incr.validator(version="1", timeout=5)(runs_ok).is_async
    with pytest.raises(TypeError, match=r"incr\.validator .*checks.* async generator"):
        incr.validator(version="1")(checks)

    @incr.llm(validators=[v], version="1")
    def sql(q, *, previous=None, feedback=()):
        return "good" if previous else "bad"

    with incr.Runtime() as rt:
        assert sql(1) == "good"                 # the async validator NACKed "bad"
        assert rt.stats()["generations"] == 2
    rt._check()


def test_llm_refuses_an_async_recheck():
    async def recheck(candidate, counterexample, q):
        return incr.ACK("ok")

    def gen(q, *, previous=None, feedback=()):
        return "x"

    with pytest.raises(TypeError, match=r"recheck.* coroutine function"):
        incr.llm(gen, recheck=recheck)


# --- at call time: the generator -----------------------------------------------------------


@pytest.mark.parametrize("shape", ["coroutine", "candidate", "awaitable"])
def test_sync_generator_returning_an_awaitable_ends_the_node_keeping_nothing(shape):
    calls, seen = [], []

    @incr.validator(version="1")
    def says_select(candidate, q):
        seen.append(candidate)
        return incr.ACK("select") if candidate.startswith("SELECT") else incr.NACK("select")

    @incr.llm(validators=[says_select], budget=incr.Budget(max_attempts=4), version="1")
    def write_sql(q, *, previous=None, feedback=()):
        calls.append(previous)
        if len(calls) == 1:
            if shape == "coroutine":
                return later("SELECT 1")          # forgot to await
            if shape == "candidate":
                return incr.Candidate(later("SELECT 1"), tokens=3)
            return Later()
        return "SELECT 1"

    rt = incr.Runtime()
    with rt, no_unawaited_warning():
        with pytest.raises(TypeError, match=r"write_sql.* returned (a coroutine|an awaitable)"
                                            r".*not a candidate"):
            write_sql(1)
        assert len(calls) == 1 and seen == []      # one call, nothing validated
        st = rt.state(write_sql, 1)
        assert (st.revision, st.candidate, st.checks) == (0, None, {})
        assert st.status != "stable"
        rt._check()
        assert write_sql(1) == "SELECT 1"          # the next demand generates again
        assert calls == [None, None]               # nothing was a `previous`
        st = rt.state(write_sql, 1)
        assert (st.revision, st.status) == (1, "stable")
        assert rt.stats()["generations"] == 2      # the refused call was spent, no more
    rt._check()


def test_generator_returning_a_coroutine_in_a_worker_thread_keeps_nothing():
    rt = incr.Runtime(max_workers=2)
    topic = rt.input("topic", "t0")
    calls = []

    @incr.llm(version="1")
    def summary(i, *, previous=None, feedback=()):
        t = topic.get()
        calls.append((i, t))
        if t == "t1" and i == 1:
            return later(f"{t}-{i}")
        return f"{t}-{i}"

    with rt, no_unawaited_warning():
        obs = [rt.observe(summary, i) for i in range(2)]
        rt.stabilize()
        topic.set("t1")
        with pytest.raises(TypeError, match=r"summary.* returned a coroutine"):
            rt.stabilize()
        assert obs[0].value == "t1-0"
        assert isinstance(obs[1].error, TypeError)
        st = rt.state(summary, 1)
        assert (st.revision, st.candidate) == (1, "t0-1")   # the old candidate, not a coroutine
        rt._check()
        topic.set("t2")
        rt.stabilize()
        assert [o.value for o in obs] == ["t2-0", "t2-1"]
    rt._check()


# --- at call time: validators and rechecks ---------------------------------------------------


@pytest.mark.parametrize("timeout", [None, 5])
def test_sync_validator_returning_a_coroutine_is_its_unknown(timeout):
    @incr.validator(version="1")
    def runs(candidate, q):
        return incr.ACK("runs")

    @incr.validator(version="1", timeout=timeout)
    def matches(candidate, q):
        return later(incr.ACK("matches"))          # forgot to await

    calls = []

    @incr.llm(validators=[runs, matches], version="1")
    def write_sql(q, *, previous=None, feedback=()):
        calls.append(q)
        return "SELECT 1"

    rt = incr.Runtime()
    with rt, no_unawaited_warning():
        with pytest.raises(incr.NotAccepted) as ei:
            write_sql(1)
        assert ei.value.reason == "unknown"
        assert len(calls) == 1
        checks = rt.state(write_sql, 1).checks
        unknown = [v for (vid, _vv, _case, _rev), v in checks.items()
                   if vid.endswith("matches")]
        assert len(unknown) == 1 and unknown[0].kind == "UNKNOWN"
        assert "matches returned a coroutine" in unknown[0].reason
        assert "matches returned a coroutine" in ei.value.report
    rt._check()


def test_sync_validator_yielding_a_coroutine_keeps_its_earlier_verdicts():
    @incr.validator(version="1")
    def checks(candidate, q):
        yield incr.ACK("runs")
        yield later(incr.NACK("matches"))          # an async check, not awaited
        yield incr.ACK("never reached")

    @incr.llm(validators=[checks], accept=incr.Acceptance(required=[]), version="1")
    def write_sql(q, *, previous=None, feedback=()):
        return "SELECT 1"

    rt = incr.Runtime()
    with rt, no_unawaited_warning():
        assert write_sql(1) == "SELECT 1"           # an optional validator's UNKNOWN
        verdicts = {(case, v.kind): v for (_vid, _vv, case, _rev), v in
                    rt.state(write_sql, 1).checks.items()}
        assert set(verdicts) == {("runs", "ACK"), ("*", "UNKNOWN")}
        assert "checks yielded a coroutine" in verdicts[("*", "UNKNOWN")].reason
    rt._check()


def test_recheck_returning_a_coroutine_is_unknown_without_warning():
    def recheck(candidate, counterexample, q):
        return later(incr.ACK("again"))

    @incr.validator(version="1")
    def no_star(candidate, q):
        return incr.ACK("ok") if "*" not in candidate else incr.NACK("ok", counterexample="*")

    answers = iter(["SELECT *", "SELECT id", "SELECT id, name"])

    @incr.llm(validators=[no_star], recheck=recheck, budget=incr.Budget(max_attempts=3),
              version="1")
    def write_sql(q, *, previous=None, feedback=()):
        return next(answers)

    rt = incr.Runtime()
    with rt, no_unawaited_warning():
        assert write_sql(1) == "SELECT id"         # a recheck's UNKNOWN is not required
        reasons = [(rev, v.reason) for (_vid, _vv, _c, rev), v in
                   rt.state(write_sql, 1).checks.items() if v.kind == "UNKNOWN"]
        assert reasons and all("recheck returned a coroutine" in r for _rev, r in reasons)
    rt._check()


# --- chat_generator --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["AsyncOpenAI", "AsyncAzureOpenAI"])
def test_chat_generator_makes_an_async_generator_for_an_async_sdk_client(kind):
    openai = pytest.importorskip("openai")
    from incr.openai_chat import AsyncChatGenerator, chat_generator

    if kind == "AsyncOpenAI":
        client = openai.AsyncOpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    else:
        client = openai.AsyncAzureOpenAI(api_key="sk-test", api_version="2024-06-01",
                                         azure_endpoint="http://127.0.0.1:9")
    gen = chat_generator("m", client=client)
    assert isinstance(gen, AsyncChatGenerator)
    assert inspect.iscoroutinefunction(type(gen).__call__)


def test_chat_generator_takes_a_client_with_an_async_create_and_closes_a_sneaky_one():
    from incr.openai_chat import chat_generator

    class Completions:
        async def create(self, **kw):
            raise AssertionError("never called")

    class Chat:
        completions = Completions()

    class AsyncClient:
        chat = Chat()

    from incr.openai_chat import AsyncChatGenerator
    assert isinstance(chat_generator("m", client=AsyncClient()), AsyncChatGenerator)

    # a sync create that hands back a coroutine anyway: refused when called, coroutine closed
    class Sneaky:
        def create(self, **kw):
            return later(None)

    class SneakyClient:
        class chat:
            completions = Sneaky()

    gen = chat_generator("m", client=SneakyClient())

    @incr.llm(version="1")
    def answer(q, *, previous=None, feedback=()):
        return gen(q, previous=previous, feedback=feedback)

    rt = incr.Runtime()
    with rt, no_unawaited_warning():
        with pytest.raises(TypeError, match=r"create returned an awaitable"):
            answer("hi")
        assert rt.state(answer, "hi").revision == 0
    rt._check()
