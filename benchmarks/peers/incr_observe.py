"""Peer "incr_observe": the same cells as ``incr``, kept up to date by observers.

``build`` observes every instance that makes up the result (``rt.observe``); ``read`` calls
``rt.stabilize()``, which recomputes the stale observed instances (and what they depend on) in
one pass, then reads the observers' values. This is incr's eager mode: what the stabilization
costs (ordering, the report it returns) is part of each op.
"""

from __future__ import annotations

from benchmarks.peers import State
from benchmarks.peers.incr_peer import structure

NAME = "incr_observe"
SUPPORTS = frozenset({"chain", "recombine", "wide", "tree", "list_map", "list_filter",
                      "list_sum"})


def build(wl):
    if wl.kind not in SUPPORTS:
        raise NotImplementedError(f"{NAME} does not implement {wl.kind}")
    b = structure(wl)
    rt = b.rt
    observers = [rt.observe(cell, *args) for cell, args in b.roots]
    assemble = b.assemble
    stabilize = rt.stabilize
    if len(observers) == 1:
        obs = observers[0]

        def read():
            with rt:
                stabilize()
                return obs.value
    else:
        def read():
            with rt:
                stabilize()
                return assemble([o.value for o in observers])
    return State(b.change, read, (b, observers))


def change(state, step):
    state.change(step)


def read(state):
    return state.read()
