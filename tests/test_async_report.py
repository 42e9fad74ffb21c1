"""rt.astabilize's report lists every run of the stabilization: a sync instance that ran in a
pass that then stopped for async work (and was not run again) is in `recomputed` too, as in
the serial stabilize (found by the async property machine)."""

from __future__ import annotations

import asyncio

import incr


def test_astabilize_reports_runs_of_a_pass_that_stopped_for_async_work():
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    def plain():
        return x.get() + 1

    @incr.cell
    async def slow():
        await asyncio.sleep(0)          # must wait: the pass stops for it
        return x.get() * 2

    rt.observe(plain)
    rt.observe(slow)

    async def main():
        return await rt.astabilize()

    rep = asyncio.run(main())
    assert sorted(rep.recomputed) == ["plain()", "slow()"]
    x.set(2)
    rep = asyncio.run(main())
    assert sorted(rep.recomputed) == ["plain()", "slow()"]
    assert rt.stabilize().recomputed == []
