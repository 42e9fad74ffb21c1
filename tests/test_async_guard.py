"""A coroutine is never a cell's value: async functions are refused at definition (this
version runs sync cells only) and a sync function that returns an awaitable fails with a
TypeError naming it, keeping nothing."""

import warnings

import pytest

import incr


def test_async_def_is_an_async_cell_and_an_async_generator_a_type_error_naming_it():
    async def fetch(x):
        return x

    assert incr.cell(fetch).is_async

    async def agen():
        yield 1

    with pytest.raises(TypeError, match="agen.*async generator function"):
        incr.cell(agen)


def test_sync_cell_returning_a_coroutine_fails_and_keeps_nothing():
    rt = incr.Runtime()
    x = rt.input("x", 1)

    async def later(v):
        return v

    @incr.cell
    def sneaky():
        v = x.get()
        return later(v) if v == 1 else v

    @incr.cell
    def reader():
        return sneaky() + 1

    with rt, warnings.catch_warnings():
        warnings.simplefilter("error")   # the coroutine is closed: no "never awaited" warning
        with pytest.raises(TypeError, match=r"sneaky\(\) returned a coroutine"):
            reader()
        rt._check()
        x.set(2)
        assert reader() == 3            # the fix reaches the reader: nothing was kept
    rt._check()
