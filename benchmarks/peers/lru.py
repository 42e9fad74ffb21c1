"""Peer "lru": ``functools.lru_cache`` (unbounded), the standard library's memoizer.

It has no notion of dependencies, so it cannot tell which entries a change invalidates: it only
runs the workloads where nothing changes (the up-to-date demand, ``noop``) and the memory one.
Its cache key for one int argument is the int itself (lru_cache's fast path for a single
int/str argument), so a hit is a C-level dict lookup: the floor for "calling something
memoized".
"""

from __future__ import annotations

from functools import lru_cache

from benchmarks.peers import State
from benchmarks.workloads import NOOP_ARG, NOOP_LOOP, memory_args

NAME = "lru"
SUPPORTS = frozenset({"noop", "memory"})


def build(wl):
    if wl.kind not in SUPPORTS:
        raise NotImplementedError(f"{NAME} does not implement {wl.kind}")
    box = wl.initial()

    if wl.kind == "noop":
        @lru_cache(maxsize=None)
        def f(i):
            return box[0] + i

        def read():
            a = NOOP_ARG
            for _ in NOOP_LOOP:
                f(a); f(a); f(a); f(a); f(a); f(a); f(a); f(a); f(a); v = f(a)  # noqa: E702
            return v
        read()
        return State(lambda step: None, read, f)

    @lru_cache(maxsize=None)
    def g(i):
        return box[0]               # a shared value: only the cache's own memory is counted

    for i in memory_args(wl.size):
        g(i)
    return State(lambda step: None, lambda: g.cache_info().currsize, g)


def change(state, step):
    state.change(step)


def read(state):
    return state.read()
