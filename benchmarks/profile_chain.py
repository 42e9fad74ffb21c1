"""Where the time of one chain propagation goes: ``python -m benchmarks.profile_chain [N]``.

cProfile cannot see inside the compiled engine, so this splits the cost of the chain workload
(change the head of N cells, read the tail) by timing variants through the public API, each
the median of many repetitions, in ns per cell:

  plain call           the cells' bodies as plain nested functions (the baseline)
  plain call, depth 10 the same, ten deep: CPython's cost per call grows with the depth of the
                       stack (about 50 ns ten deep, 145 ns 300 deep, 220 ns 10^4 deep here), so
                       the deep chain is a kinder baseline for incr than a shallow call
  set (dirty)          ``x.set``: marking N cells stale
  set + pull           ``x.set`` then demanding the tail: the whole op of the ``incr`` peer
  set + stabilize      the same through an observer and ``rt.stabilize()`` (``incr_observe``)
  demand, top level    calling an up-to-date cell from outside any cell
  demand, in a cell    calling an up-to-date cell from inside a running cell (records a read)
  cutoff=NEVER         the chain with no equality check on recomputed values

"run overhead" is then set+pull − set − demand-in-a-cell − plain call: what ``ensure`` and
``run`` cost per cell beyond the call a cell makes to its dependency (frame, invoke, rewire,
timestamps, cutoff). For native frames, run the loop under ``perf``:

    perf record -g python -m benchmarks.profile_chain --loop 10 && perf report --no-children

(no rebuild of incr may happen between record and report, or the symbols will be wrong).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import incr


def _median_ns(fn, per: int, reps: int = 15, min_s: float = 0.02) -> float:
    """Median over ``reps`` of the time of ``fn()`` (looped to last ``min_s``) / ``per``, in ns."""
    k = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        if time.perf_counter() - t0 >= min_s:
            break
        k *= 2
    out = []
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            out.append((time.perf_counter() - t0) / k / per * 1e9)
    finally:
        gc.enable()
    return statistics.median(out)


def chain(n: int, cutoff=incr.EQUAL):
    rt = incr.Runtime()
    x = rt.input("x", 0)

    def make(i, prev):
        if prev is None:
            def fn():
                return x.get() + 1
        else:
            def fn():
                return prev() + 1
        fn.__qualname__ = f"c{i}"
        return incr.cell(fn, cutoff=cutoff)

    cells = []
    prev = None
    for i in range(n):
        prev = make(i, prev)
        cells.append(prev)
    with rt:
        for c in cells:
            c()
    return rt, x, cells[-1]


def plain_chain(n: int):
    box = [0]

    def make(prev):
        if prev is None:
            def fn():
                return box[0] + 1
        else:
            def fn():
                return prev() + 1
        return fn

    fn = None
    for _ in range(n):
        fn = make(fn)
    if n + 200 > sys.getrecursionlimit():
        sys.setrecursionlimit(n + 200)
    return box, fn


def measure(n: int) -> dict:
    res = {}
    box, fn = plain_chain(n)
    res["plain call"] = _median_ns(fn, n)
    _, fn10 = plain_chain(10)
    res["plain call, depth 10"] = _median_ns(fn10, 10)

    rt, x, tail = chain(n)
    v = iter(range(1, 10**9))

    # set alone: time only the set, demanding the tail untimed between repetitions
    def set_only(reps=200):
        out = []
        with rt:
            for _ in range(reps):
                tail()
                val = next(v)
                t0 = time.perf_counter()
                x.set(val)
                out.append((time.perf_counter() - t0) / n * 1e9)
        return statistics.median(out)
    gc.disable()
    res["set (dirty)"] = set_only()
    gc.enable()

    def pull():
        x.set(next(v))
        with rt:
            tail()
    res["set + pull"] = _median_ns(pull, n)

    rt2, x2, tail2 = chain(n)
    with rt2:
        rt2.observe(tail2)
    v2 = iter(range(1, 10**9))

    def stab():
        x2.set(next(v2))
        rt2.stabilize()
    res["set + stabilize"] = _median_ns(stab, n)

    rt3, x3, tail3 = chain(n, cutoff=incr.NEVER)
    v3 = iter(range(1, 10**9))

    def pull_never():
        x3.set(next(v3))
        with rt3:
            tail3()
    res["set + pull, cutoff=NEVER"] = _median_ns(pull_never, n)

    # demands of an up-to-date instance: from the top level, and from inside a running cell
    rt4 = incr.Runtime()
    y = rt4.input("y", 1)

    @incr.cell
    def leaf():
        return y.get()

    K = 1000
    rng = range(K // 10)

    @incr.cell(cutoff=incr.NEVER)
    def caller(i):
        for _ in rng:
            leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf()  # noqa: E702
        return i

    def top():
        for _ in rng:
            leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf(); leaf()  # noqa: E702

    counter = iter(range(10**9))
    with rt4:
        leaf()
        res["demand, top level"] = _median_ns(top, K)
        # a fresh instance each time: one run of `caller`, K demands of `leaf` inside it
        per_run = _median_ns(lambda: caller(next(counter)), K)
        res["demand, in a cell"] = per_run

    res["run overhead (derived)"] = (res["set + pull"] - res["set (dirty)"]
                                     - res["demand, in a cell"] - res["plain call"])
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_chain")
    ap.add_argument("n", nargs="?", type=int, default=300)
    ap.add_argument("--loop", type=float, default=0.0,
                    help="instead, just run set + pull on the chain for this many seconds "
                         "(for perf record)")
    args = ap.parse_args(argv)
    if args.loop:
        rt, x, tail = chain(args.n)
        t_end = time.perf_counter() + args.loop
        i = 0
        with rt:
            while time.perf_counter() < t_end:
                i += 1
                x.set(i)
                tail()
        return 0
    res = measure(args.n)
    plain = res["plain call"]
    print(f"chain of {args.n} cells, incr {incr.__version__}, Python {sys.version.split()[0]}")
    for k, ns in res.items():
        print(f"  {k:<26} {ns:8.1f} ns/cell  ({ns / plain:5.1f}× a plain call)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
