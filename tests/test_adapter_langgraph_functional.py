"""LangGraph's functional API (``@task(cache_policy=...)`` inside an ``@entrypoint``) cached by
``IncrCache``, keyed by the task's code identity.

LangGraph names a task's cache namespace with two parts, ``("__pregel_ns_writes",
"module.qualname")`` (a graph node's has three); ``IncrCache`` finds the task's function by
that name (a module-level task, no ``watch``), or is told it with ``cache.watch([task])`` (a
task defined inside a function, which no name reaches).

The tests marked "ported" are LangGraph's own, from langchain-ai/langgraph (MIT licence,
Copyright (c) 2024 LangChain, Inc.), libs/langgraph/tests/test_pregel.py and
test_pregel_async.py at commit f09cfe8ff: ``test_multiple_interrupts_functional_cache`` (sync
and async). Changes: the ``cache`` fixture is an ``IncrCache`` on a temporary store, the
checkpointer fixture LangGraph's ``InMemorySaver``; ``cache.watch([double])`` after the
nested task is defined (it is a ``<locals>`` function); the async one runs with
``asyncio.run`` (no pytest-asyncio here). The assertions are LangGraph's, unchanged.
"""

import asyncio
import sys
import types
import uuid
import warnings

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.func import entrypoint, task  # noqa: E402
from langgraph.types import CachePolicy, Command, interrupt  # noqa: E402

import incr  # noqa: E402
from incr.adapters.langgraph import IncrCache  # noqa: E402


@pytest.fixture
def cache(tmp_path):
    c = IncrCache(tmp_path / "lg")
    yield c
    c.close()


# --- ported from LangGraph ---------------------------------------------------------------------


def test_multiple_interrupts_functional_cache(cache):
    """Test multiple interrupts with functional API."""
    sync_checkpointer = InMemorySaver()

    counter = 0

    @task(cache_policy=CachePolicy())
    def double(x: int) -> int:
        """Increment the counter."""
        nonlocal counter
        counter += 1
        return 2 * x

    cache.watch([double])   # (incr: a task defined in a function is not reachable by name)

    @entrypoint(checkpointer=sync_checkpointer, cache=cache)
    def graph(state: dict) -> dict:
        """React tool."""

        values = []

        for idx in [1, 1, 2, 2, 3, 3]:
            values.extend([double(idx).result(), interrupt({"a": "boo"})])

        return {"values": values}

    configurable = {"configurable": {"thread_id": str(uuid.uuid4())}}
    graph.invoke({}, configurable)
    graph.invoke(Command(resume="a"), configurable)
    graph.invoke(Command(resume="b"), configurable)
    graph.invoke(Command(resume="c"), configurable)
    graph.invoke(Command(resume="d"), configurable)
    graph.invoke(Command(resume="e"), configurable)
    result = graph.invoke(Command(resume="f"), configurable)
    # `double` value should be cached appropriately when used w/ `interrupt`
    assert result == {
        "values": [2, "a", 2, "b", 4, "c", 4, "d", 6, "e", 6, "f"],
    }
    assert counter == 3

    # should all be cached now
    configurable = {"configurable": {"thread_id": str(uuid.uuid4())}}
    graph.invoke({}, configurable)
    graph.invoke(Command(resume="a"), configurable)
    graph.invoke(Command(resume="b"), configurable)
    graph.invoke(Command(resume="c"), configurable)
    graph.invoke(Command(resume="d"), configurable)
    graph.invoke(Command(resume="e"), configurable)
    result = graph.invoke(Command(resume="f"), configurable)
    # `double` value should be cached appropriately when used w/ `interrupt`
    assert result == {
        "values": [2, "a", 2, "b", 4, "c", 4, "d", 6, "e", 6, "f"],
    }
    assert counter == 3

    # clear cache
    double.clear_cache(cache)

    # should recompute now
    configurable = {"configurable": {"thread_id": str(uuid.uuid4())}}
    graph.invoke({}, configurable)
    graph.invoke(Command(resume="a"), configurable)
    graph.invoke(Command(resume="b"), configurable)
    graph.invoke(Command(resume="c"), configurable)
    graph.invoke(Command(resume="d"), configurable)
    graph.invoke(Command(resume="e"), configurable)
    result = graph.invoke(Command(resume="f"), configurable)
    # `double` value should be cached appropriately when used w/ `interrupt`
    assert result == {
        "values": [2, "a", 2, "b", 4, "c", 4, "d", 6, "e", 6, "f"],
    }
    assert counter == 6


def test_multiple_interrupts_functional_cache_async(cache):
    """Test multiple interrupts with functional API."""
    async_checkpointer = InMemorySaver()
    counter = 0

    @task(cache_policy=CachePolicy())
    def double(x: int) -> int:
        """Increment the counter."""
        nonlocal counter
        counter += 1
        return 2 * x

    cache.watch([double])   # (incr: a task defined in a function is not reachable by name)

    @entrypoint(checkpointer=async_checkpointer, cache=cache)
    def graph(state: dict) -> dict:
        """React tool."""

        values = []

        for idx in [1, 1, 2, 2, 3, 3]:
            values.extend([double(idx).result(), interrupt({"a": "boo"})])

        return {"values": values}

    async def main():
        nonlocal counter
        configurable = {"configurable": {"thread_id": str(uuid.uuid4())}}
        await graph.ainvoke({}, configurable)
        await graph.ainvoke(Command(resume="a"), configurable)
        await graph.ainvoke(Command(resume="b"), configurable)
        await graph.ainvoke(Command(resume="c"), configurable)
        await graph.ainvoke(Command(resume="d"), configurable)
        await graph.ainvoke(Command(resume="e"), configurable)
        result = await graph.ainvoke(Command(resume="f"), configurable)
        # `double` value should be cached appropriately when used w/ `interrupt`
        assert result == {
            "values": [2, "a", 2, "b", 4, "c", 4, "d", 6, "e", 6, "f"],
        }
        assert counter == 3

        configurable = {"configurable": {"thread_id": str(uuid.uuid4())}}
        await graph.ainvoke({}, configurable)
        await graph.ainvoke(Command(resume="a"), configurable)
        await graph.ainvoke(Command(resume="b"), configurable)
        await graph.ainvoke(Command(resume="c"), configurable)
        await graph.ainvoke(Command(resume="d"), configurable)
        await graph.ainvoke(Command(resume="e"), configurable)
        result = await graph.ainvoke(Command(resume="f"), configurable)
        # `double` value should be cached appropriately when used w/ `interrupt`
        assert result == {
            "values": [2, "a", 2, "b", 4, "c", 4, "d", 6, "e", 6, "f"],
        }
        assert counter == 3

        # clear the cache
        await double.aclear_cache(cache)

        # now should recompute
        configurable = {"configurable": {"thread_id": str(uuid.uuid4())}}
        await graph.ainvoke({}, configurable)
        await graph.ainvoke(Command(resume="a"), configurable)
        await graph.ainvoke(Command(resume="b"), configurable)
        await graph.ainvoke(Command(resume="c"), configurable)
        await graph.ainvoke(Command(resume="d"), configurable)
        await graph.ainvoke(Command(resume="e"), configurable)
        result = await graph.ainvoke(Command(resume="f"), configurable)
        # `double` value should be cached appropriately when used w/ `interrupt`
        assert result == {
            "values": [2, "a", 2, "b", 4, "c", 4, "d", 6, "e", 6, "f"],
        }
        assert counter == 6

    asyncio.run(main())


# --- incr's own: module-level tasks without watch, the code identity, the warning --------------

CALLS: list = []


def _module(name: str, factor: int):
    """A module ``name`` (registered in sys.modules) holding a module-level ``@task`` whose
    body multiplies by ``factor``: an edit of its body is a new ``factor``."""
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    src = (f"from langgraph.func import task\n"
           f"from langgraph.types import CachePolicy\n"
           f"import test_adapter_langgraph_functional as t\n"
           f"@task(cache_policy=CachePolicy())\n"
           f"def scale(x):\n"
           f"    t.CALLS.append(x)\n"
           f"    return x * {factor}\n")
    exec(compile(src, f"<{name}>", "exec"), vars(mod))  # noqa: S102 - the test's own source
    return mod


def _workflow(mod, cache):
    @entrypoint(cache=cache)
    def wf(xs: list) -> list:
        return [mod.scale(x).result() for x in xs]
    return wf


def test_a_module_level_task_is_cached_without_watch_and_across_processes_of_the_store(
        tmp_path):
    CALLS.clear()
    mod = _module("lg_functional_tasks", 10)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", incr.NotPersistableWarning)   # no "not cached"
            cache = IncrCache(tmp_path / "lg")
            wf = _workflow(mod, cache)
            assert wf.invoke([1, 2, 2]) == [10, 20, 20]
            assert CALLS == [1, 2]                  # 2 ran once: the second call was a hit
            assert wf.invoke([1, 2, 3]) == [10, 20, 30]
            assert CALLS == [1, 2, 3]               # only 3 ran
            assert cache.counts["writes"] == 3
            cache.close()
            # a new cache on the same store (a later process): every entry found
            cache = IncrCache(tmp_path / "lg")
            assert _workflow(mod, cache).invoke([3, 2, 1]) == [30, 20, 10]
            assert CALLS == [1, 2, 3]
            cache.close()
    finally:
        del sys.modules["lg_functional_tasks"]


def test_an_edited_task_body_is_not_served_the_old_result(tmp_path):
    """LangGraph keys a task by its name only; IncrCache adds the code identity, so after an
    edit (same module, same name, another body) the old entry is not a hit."""
    CALLS.clear()
    try:
        cache = IncrCache(tmp_path / "lg")
        assert _workflow(_module("lg_functional_edit", 10), cache).invoke([4]) == [40]
        assert _workflow(_module("lg_functional_edit", 100), cache).invoke([4]) == [400]
        assert CALLS == [4, 4]
        # and back: the first version's entry is still there
        assert _workflow(_module("lg_functional_edit", 10), cache).invoke([4]) == [40]
        assert CALLS == [4, 4]
        cache.close()
    finally:
        del sys.modules["lg_functional_edit"]


def test_a_nested_task_without_watch_is_not_cached_and_the_warning_says_what_to_do(cache):
    calls = []

    @task(cache_policy=CachePolicy())
    def inner(x):
        calls.append(x)
        return x + 1

    @entrypoint(cache=cache)
    def wf(x: int) -> int:
        return inner(x).result()

    with pytest.warns(incr.NotPersistableWarning) as rec:
        assert wf.invoke(1) == 2
        assert wf.invoke(1) == 2
    assert calls == [1, 1]                     # not cached: its code is unknown
    msgs = [str(w.message) for w in rec]
    assert len(msgs) == 1, msgs                # one warning per task
    assert "cache.watch([inner])" in msgs[0] and "task" in msgs[0], msgs[0]
    cache.watch([inner])
    assert wf.invoke(1) == 2 and wf.invoke(1) == 2
    assert calls == [1, 1, 1]                  # now cached


def test_watch_versions_name_a_task_version(cache):
    calls = []

    def make(k):
        @task(cache_policy=CachePolicy())
        def step(x):
            calls.append(x)
            return x * k
        return step

    step = make(2)
    cache.watch([step], versions={"step": "1"})

    @entrypoint(cache=cache)
    def wf(x: int) -> int:
        return step(x).result()

    assert wf.invoke(5) == 10 and wf.invoke(5) == 10
    assert calls == [5]
    cache.watch([step], versions={"step": "2"})   # a new version: a new entry
    assert wf.invoke(5) == 10
    assert calls == [5, 5]
