"""LangGraph's ``BaseCache`` contract, run against ``IncrCache``.

Any value LangGraph may give ``set`` comes back from ``get`` identical (same types at every
level, same dict order), or ``set`` refuses it (not cached, a ``NotPersistableWarning``) --
never a different value.

The tests marked "ported" are LangGraph's own tests of ``InMemoryCache``
(langchain-ai/langgraph, libs/checkpoint/tests/test_cache.py:
``test_in_memory_cache_keyword_args``, ``test_in_memory_cache_async_keyword_args``), with
``InMemoryCache()`` replaced by an ``IncrCache`` that knows the node ``"ns"`` (IncrCache keys
entries by the node's code, so it must be told which code the namespace stands for), and the
async one run with ``asyncio.run`` (no pytest-asyncio here). The others follow what
``langgraph.cache.memory.InMemoryCache`` does (get/set/clear, TTL, async twins).
"""

import asyncio
import datetime
import decimal
import inspect
import uuid
import warnings
from collections import deque
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.cache.base import BaseCache, FullKey  # noqa: E402
from langgraph.cache.memory import InMemoryCache  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402

import incr  # noqa: E402
from incr.adapters import langgraph as lg  # noqa: E402
from incr.adapters.langgraph import IncrCache  # noqa: E402


def node_fn(state):
    return state


def _cache(tmp_path, **kw):
    return IncrCache(tmp_path / "c", nodes={"ns": node_fn, "other": node_fn}, **kw)


NS = ("ns",)
K = (NS, "k")

VALUES = [
    {"result": 42},
    "hello",
    42,
    1.5,
    True,
    None,
    b"bytes",
    [1, 2, 3],
    (1, "two", 3.0),
    [("n", 3)],
    [["n", 3]],
    deque([("a", 1), ("b", {"x": [1, (2, 3)]})]),
    {"b": 1, "a": 2},                      # dict order is kept
    {"nested": {"t": (1, 2), "l": [1.0, 2]}},
    {1, 2, 3},
    frozenset({"a"}),
    datetime.datetime(2024, 1, 2, 3, 4, 5),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    decimal.Decimal("1.5"),
    deque([("messages", datetime.date(2024, 1, 1))]),   # writes only serde can store
    [],
    deque(),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{type(v).__name__}:{v!r}"[:40])
def test_any_value_round_trips_exactly(tmp_path, value):
    cache = _cache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.set({K: (value, None)})
    got = cache.get([K])
    assert list(got) == [K]
    assert lg._same(got[K], value), (got[K], value)
    assert type(got[K]) is type(value)
    cache.close()


def test_the_reported_corruptions(tmp_path):
    cache = _cache(tmp_path)
    cache.set({K: ({"result": 42}, None), ((("other",)), "k"): ("hello", None)})
    assert cache.get([K, (("other",), "k")]) == {K: {"result": 42},
                                                  (("other",), "k"): "hello"}
    cache.close()


class Opaque:
    """Compared by identity: no serializer can give the same value back."""


@pytest.mark.parametrize("value", [Opaque(), [("x", Opaque())], deque([("x", Opaque())])],
                         ids=["opaque", "writes-list", "writes-deque"])
def test_a_value_that_cannot_round_trip_is_refused_not_corrupted(tmp_path, value):
    cache = _cache(tmp_path)
    with pytest.warns(incr.NotPersistableWarning, match="not cached"):
        cache.set({K: (value, None)})
    assert cache.get([K]) == {}
    assert cache.counts["refused"] == 1
    cache.close()


def test_pickle_serde_is_refused_with_a_clear_warning(tmp_path):
    cache = _cache(tmp_path, serde=JsonPlusSerializer(pickle_fallback=True))
    with pytest.warns(incr.NotPersistableWarning, match="pickle"):
        cache.set({K: (Opaque(), None)})
    assert cache.get([K]) == {} and len(cache) == 0
    cache.close()


def test_missing_key_and_empty_get(tmp_path):
    cache = _cache(tmp_path)
    assert cache.get([]) == {}
    assert cache.get([K]) == {}
    cache.close()


def test_ttl_expires(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    now = [1000.0]
    monkeypatch.setattr(lg.time, "time", lambda: now[0])
    cache.set({(NS, "short"): ({"v": 1}, 10), (NS, "forever"): ("x", None)})
    now[0] += 11
    assert cache.get([(NS, "short"), (NS, "forever")]) == {(NS, "forever"): "x"}
    cache.close()


def test_clear_namespaces_and_all(tmp_path):
    cache = _cache(tmp_path)
    other = (("other",), "k")
    cache.set({K: (1, None), other: (2, None)})
    cache.clear([NS])
    assert cache.get([K, other]) == {other: 2}
    cache.set({K: (1, None)})
    cache.clear()
    assert cache.get([K, other]) == {}
    cache.close()


def test_overwrite_replaces(tmp_path):
    cache = _cache(tmp_path)
    cache.set({K: ({"a": 1}, None)})
    cache.set({K: ("now a string", None)})
    assert cache.get([K]) == {K: "now a string"}
    cache.close()


def test_async_twins(tmp_path):
    cache = _cache(tmp_path)

    async def main():
        await cache.aset({K: ({"result": 42}, None)})
        got = await cache.aget([K])
        await cache.aclear([NS])
        return got, await cache.aget([K])

    assert asyncio.run(main()) == ({K: {"result": 42}}, {})
    cache.close()


def test_same_answers_as_in_memory_cache(tmp_path):
    """For values both can store exactly, IncrCache answers what InMemoryCache answers."""
    cache, mem = _cache(tmp_path), InMemoryCache()
    pairs = {(NS, f"k{i}"): (v, None) for i, v in enumerate(
        [{"result": 42}, "hello", 42, None, {"b": 1, "a": 2}, {1, 2}])}
    cache.set(pairs)
    mem.set(pairs)
    keys = list(pairs) + [(NS, "absent")]
    assert cache.get(keys) == mem.get(keys)
    cache.close()


# --- ported from langchain-ai/langgraph libs/checkpoint/tests/test_cache.py -------------------


def test_base_cache_signatures() -> None:
    # ported: IncrCache in place of InMemoryCache and RedisCache (the installed InMemoryCache
    # still names the argument `keys`)
    for cache_cls in (BaseCache, IncrCache):
        set_params = list(inspect.signature(cache_cls.set).parameters.keys())
        assert "pairs" in set_params, f"{cache_cls.__name__}.set must have 'pairs' parameter"
        aset_params = list(inspect.signature(cache_cls.aset).parameters.keys())
        assert "pairs" in aset_params, f"{cache_cls.__name__}.aset must have 'pairs' parameter"


def test_in_memory_cache_keyword_args(tmp_path) -> None:
    # ported: InMemoryCache() -> IncrCache that knows node "ns"
    cache = _cache(tmp_path)
    key: FullKey = (("ns",), "k1")
    value: tuple[Any, int | None] = ({"data": 123}, 60)

    cache.set(pairs={key: value})
    res = cache.get([key])
    assert res == {key: {"data": 123}}

    key2: FullKey = (("ns",), "k2")
    cache.set({key2: ({"data": 456}, None)})
    assert cache.get([key2]) == {key2: {"data": 456}}
    cache.close()


def test_in_memory_cache_async_keyword_args(tmp_path) -> None:
    # ported: InMemoryCache() -> IncrCache; @pytest.mark.asyncio -> asyncio.run
    cache = _cache(tmp_path)

    async def main():
        key: FullKey = (("ns",), "k1")
        value: tuple[Any, int | None] = ({"data": 789}, 60)
        await cache.aset(pairs={key: value})
        res = await cache.aget([key])
        assert res == {key: {"data": 789}}

        key2: FullKey = (("ns",), "k2")
        await cache.aset({key2: ({"data": 999}, None)})
        assert await cache.aget([key2]) == {key2: {"data": 999}}

    asyncio.run(main())
    cache.close()
