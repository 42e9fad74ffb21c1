"""Peer "plain": what you would write without incr, recomputing everything on every read.

Graph-shaped workloads (chain, recombine, wide, noop) call the same node functions as the incr
cells, each once, in dependency order: for the chain that is a nested call chain, exactly the
cells' bodies with plain functions in place of cells. Collection workloads (tree, list_*) use
the idiomatic one-liner over a Python list: ``sum(xs)``, a comprehension. Those run their
per-element work in C (``sum``) or in a tight comprehension loop, which makes them the hardest
baseline incr can be compared with, not the one most flattering to it.

Inputs are a mutable list ``box`` (one slot per input); ``change`` writes one slot, O(1).
"""

from __future__ import annotations

import sys

from benchmarks.peers import State
from benchmarks.workloads import NOOP_ARG, NOOP_LOOP, P

NAME = "plain"
SUPPORTS = frozenset({"chain", "recombine", "wide", "tree", "noop", "list_map",
                      "list_filter", "list_sum"})


def _set(box):
    def change(step):
        box[step[0]] = step[1]
    return change


def _chain(wl):
    box = wl.initial()

    def make(prev):
        if prev is None:
            def fn():
                return box[0] + 1
        else:
            def fn():
                return prev() + 1
        return fn

    fn = None
    for _ in range(wl.size):
        fn = make(fn)
    # a nested chain of N Python calls needs N frames; CPython 3.11 keeps Python-to-Python
    # calls off the C stack, so raising the limit is safe here (incr needs no such thing)
    if wl.size + 200 > sys.getrecursionlimit():
        sys.setrecursionlimit(wl.size + 200)
    return _set(box), fn


def _recombine(wl):
    box = wl.initial()
    n = wl.size

    def fa0(x):
        return x + 1

    def fb0(x):
        return 2 * x

    def fa(a, b):
        return (a + b) % P

    def fb(a, b):
        return (a - b) % P

    def read():
        x = box[0]
        a, b = fa0(x), fb0(x)
        for _ in range(n - 1):
            a, b = fa(a, b), fb(a, b)
        return (a, b)
    return _set(box), read


def _wide(wl):
    box = wl.initial()
    idx = range(wl.size)

    def w(i):
        return box[0] * i + 1

    def read():
        return [w(i) for i in idx]
    return _set(box), read


def _noop(wl):
    box = wl.initial()

    def f(i):
        return box[0] + i

    def read():
        a = NOOP_ARG
        for _ in NOOP_LOOP:
            f(a); f(a); f(a); f(a); f(a); f(a); f(a); f(a); f(a); v = f(a)  # noqa: E702
        return v
    return (lambda step: None), read


def _tree(wl):
    box = wl.initial()
    return _set(box), lambda: sum(box)


_list_sum = _tree


def _list_map(wl):
    box = wl.initial()
    return _set(box), lambda: [3 * v + 1 for v in box]


def _list_filter(wl):
    box = wl.initial()
    return _set(box), lambda: [v for v in box if v % 3 == 0]


_BUILDERS = {
    "chain": _chain, "recombine": _recombine, "wide": _wide, "tree": _tree, "noop": _noop,
    "list_map": _list_map, "list_filter": _list_filter, "list_sum": _list_sum,
}


def build(wl):
    if wl.kind not in SUPPORTS:
        raise NotImplementedError(f"{NAME} does not implement {wl.kind}")
    change, read = _BUILDERS[wl.kind](wl)
    read()
    return State(change, read)


def change(state, step):
    state.change(step)


def read(state):
    return state.read()
