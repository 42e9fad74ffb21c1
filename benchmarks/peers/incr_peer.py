"""Peer "incr": the workloads as incr cells, read by demand (pull).

``read`` demands the result instance(s) from the top, inside ``with rt:``; incr then verifies
the stale instances below it and recomputes what changed. ``incr_observe`` builds the very same
cells and reads through observers and ``rt.stabilize()`` instead.

Cells are written the way a user would write them: one cell per node function, instances keyed
by their arguments (tree, lists, wide), or one cell per link where the graph is a line of
distinct functions (chain, recombine), made in a loop with a ``__qualname__`` each.
"""

from __future__ import annotations

import incr

from benchmarks.peers import State
from benchmarks.workloads import CHUNK, NOOP_ARG, NOOP_LOOP, P, memory_args

NAME = "incr"
SUPPORTS = frozenset({"chain", "recombine", "wide", "tree", "noop", "list_map",
                      "list_filter", "list_sum", "memory"})


class Built:
    """The cells of one workload, before a read mode is chosen."""

    __slots__ = ("rt", "change", "roots", "assemble", "extra")

    def __init__(self, rt, change, roots, assemble, extra=None):
        self.rt = rt
        self.change = change            # step -> None
        self.roots = roots              # [(cell, args)]: the instances that make the result
        self.assemble = assemble        # [root values] -> result
        self.extra = extra


def _one(values):
    return values[0]


def _set_single(x):
    def change(step):
        x.set(step[1])
    return change


def _set_many(inputs):
    def change(step):
        inputs[step[0]].set(step[1])
    return change


def _named(fn, name):
    fn.__qualname__ = name
    return incr.cell(fn)


def _chain(wl):
    rt = incr.Runtime()
    x = rt.input("x", wl.initial()[0])

    def make(i, prev):
        if prev is None:
            def fn():
                return x.get() + 1
        else:
            def fn():
                return prev() + 1
        return _named(fn, f"c{i}")

    cells = []
    prev = None
    for i in range(wl.size):
        prev = make(i, prev)
        cells.append(prev)
    with rt:
        for c in cells:     # bottom-up, so that no first-time demand nests deeper than one link
            c()
    return Built(rt, _set_single(x), [(cells[-1], ())], _one, cells)


def _recombine(wl):
    rt = incr.Runtime()
    x = rt.input("x", wl.initial()[0])

    def level(i, a, b):
        if a is None:
            def fa():
                return x.get() + 1

            def fb():
                return 2 * x.get()
        else:
            def fa():
                return (a() + b()) % P

            def fb():
                return (a() - b()) % P
        return _named(fa, f"a{i}"), _named(fb, f"b{i}")

    a = b = None
    cells = []
    for i in range(wl.size):
        a, b = level(i, a, b)
        cells.append((a, b))
    with rt:
        for ca, cb in cells:
            ca()
            cb()
    return Built(rt, _set_single(x), [(a, ()), (b, ())], tuple, cells)


def _wide(wl):
    rt = incr.Runtime()
    x = rt.input("x", wl.initial()[0])

    @incr.cell
    def w(i):
        return x.get() * i + 1

    with rt:
        for i in range(wl.size):
            w(i)
    return Built(rt, _set_single(x), [(w, (i,)) for i in range(wl.size)], list, w)


def _tree(wl):
    rt = incr.Runtime()
    inputs = [rt.input(f"x{i}", v) for i, v in enumerate(wl.initial())]

    @incr.cell
    def t(lo, hi):
        if hi - lo == 1:
            return inputs[lo].get()
        mid = (lo + hi) // 2
        return t(lo, mid) + t(mid, hi)

    with rt:
        t(0, wl.size)
    return Built(rt, _set_many(inputs), [(t, (0, wl.size))], _one, t)


def _noop(wl):
    rt = incr.Runtime()
    x = rt.input("x", wl.initial()[0])

    @incr.cell
    def f(i):
        return x.get() + i

    with rt:
        f(NOOP_ARG)
    return Built(rt, lambda step: None, [(f, (NOOP_ARG,))], _one, f)


def _rope_over(leaf):
    """A balanced tree of cells over chunk indices whose value is a rope of the leaves."""
    @incr.cell
    def rope(lo, hi):
        if hi - lo == 1:
            return leaf(lo)
        mid = (lo + hi) // 2
        return (rope(lo, mid), rope(mid, hi))
    return rope


def _chunks(n):
    return (n + CHUNK - 1) // CHUNK


def _list_map(wl):
    rt = incr.Runtime()
    inputs = [rt.input(f"x{i}", v) for i, v in enumerate(wl.initial())]
    n = wl.size

    @incr.cell
    def m(i):                       # one instance per element
        return 3 * inputs[i].get() + 1

    @incr.cell
    def gather(c):                  # the mapped values of one chunk, as a tuple
        return tuple([m(i) for i in range(c * CHUNK, min(n, (c + 1) * CHUNK))])

    rope = _rope_over(gather)
    with rt:
        rope(0, _chunks(n))
    return Built(rt, _set_many(inputs), [(rope, (0, _chunks(n)))], _one, rope)


def _list_filter(wl):
    rt = incr.Runtime()
    inputs = [rt.input(f"x{i}", v) for i, v in enumerate(wl.initial())]
    n = wl.size

    @incr.cell
    def keep(c):                    # the kept values of one chunk of inputs
        out = []
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            v = inputs[i].get()
            if v % 3 == 0:
                out.append(v)
        return tuple(out)

    rope = _rope_over(keep)
    with rt:
        rope(0, _chunks(n))
    return Built(rt, _set_many(inputs), [(rope, (0, _chunks(n)))], _one, rope)


def _list_sum(wl):
    rt = incr.Runtime()
    inputs = [rt.input(f"x{i}", v) for i, v in enumerate(wl.initial())]
    n = wl.size

    @incr.cell
    def chunk_sum(c):
        s = 0
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            s += inputs[i].get()
        return s

    @incr.cell
    def total(lo, hi):
        if hi - lo == 1:
            return chunk_sum(lo)
        mid = (lo + hi) // 2
        return total(lo, mid) + total(mid, hi)

    with rt:
        total(0, _chunks(n))
    return Built(rt, _set_many(inputs), [(total, (0, _chunks(n)))], _one, total)


def _memory(wl):
    rt = incr.Runtime()
    x = rt.input("x", wl.initial()[0])

    @incr.cell
    def f(i):
        return x.get()              # a shared value: only the engine's memory is counted

    with rt:
        for i in memory_args(wl.size):
            f(i)
    return Built(rt, lambda step: None, [], lambda vs: rt.stats()["instances"], f)


_BUILDERS = {
    "chain": _chain, "recombine": _recombine, "wide": _wide, "tree": _tree, "noop": _noop,
    "list_map": _list_map, "list_filter": _list_filter, "list_sum": _list_sum,
    "memory": _memory,
}


def structure(wl) -> Built:
    """The incr cells of ``wl``, computed once; shared with ``incr_observe``."""
    if wl.kind not in SUPPORTS:
        raise NotImplementedError(f"{NAME} does not implement {wl.kind}")
    return _BUILDERS[wl.kind](wl)


def build(wl):
    b = structure(wl)
    rt = b.rt
    assemble = b.assemble
    if wl.kind == "noop":
        f = b.extra

        def read():
            a = NOOP_ARG
            with rt:
                for _ in NOOP_LOOP:   # ten demands a turn, so the loop costs little per demand
                    f(a); f(a); f(a); f(a); f(a); f(a); f(a); f(a); f(a); v = f(a)  # noqa: E702
            return v
    elif wl.kind == "memory":
        def read():
            return assemble(())
    elif len(b.roots) == 1:
        (cell, args), = b.roots

        def read():
            with rt:
                return cell(*args)
    else:
        roots = b.roots

        def read():
            with rt:
                return assemble([c(*a) for c, a in roots])
    return State(b.change, read, b)


def change(state, step):
    state.change(step)


def read(state):
    return state.read()
