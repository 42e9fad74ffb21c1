"""Peer "reaktiv_effect": the ``reaktiv`` graph with an ``Effect`` on every result node (push).

The effects make the graph "tracking": ``Signal.set`` notifies its dependents, transitively, and
runs the effects, which recompute what changed before ``set`` returns; ``read`` then only
collects values that are already current. This is the counterpart of ``incr_observe``
(observers + stabilize). It is the mode reaktiv is designed around, not its fastest one here.
"""

from __future__ import annotations

from reaktiv import Effect

from benchmarks.peers import State
from benchmarks.peers.reaktiv_peer import graph, reader

NAME = "reaktiv_effect"
SUPPORTS = frozenset({"chain", "recombine", "wide", "tree"})


def _watch(node):
    # a closure, not ``lambda c=c: ...``: reaktiv passes a cleanup registrar to effects whose
    # function takes a parameter
    return lambda: node()


def build(wl):
    if wl.kind not in SUPPORTS:
        raise NotImplementedError(f"{NAME} does not implement {wl.kind}")
    g = graph(wl)
    # reaktiv holds effects weakly: keep them in the state
    effects = [Effect(_watch(c)) for c in g.roots]
    return State(g.change, reader(wl, g), (g, effects))


def change(state, step):
    state.change(step)


def read(state):
    return state.read()
