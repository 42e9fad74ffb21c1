"""Peer "reaktiv": the workloads as reaktiv ``Signal``s and ``Computed``s, read by pull.

Inputs are ``Signal``s, every node a ``Computed`` over the same expression as the incr cell;
``read`` calls the result node(s). With no ``Effect`` subscribed, reaktiv's computeds are not
"tracking": a read after a change re-validates the graph below the node by walking it (a
recursive ``_refresh`` per node), and recomputes what changed. This is reaktiv's cheapest way to
run these workloads; ``reaktiv_effect`` subscribes effects instead (push).

reaktiv runs with its defaults (thread safety on: an ``RLock`` per signal), as a user gets it.
Its computeds compare by identity (``is``), incr by equality: on these workloads every change
gives new int objects, so both recompute the same nodes. reaktiv has no argument-keyed
instances: where incr has one cell with N instances, reaktiv gets N ``Computed`` objects over
one shared function (or one closure per node where the node needs its own operands).
"""

from __future__ import annotations

from reaktiv import Computed, Signal

from benchmarks.peers import State
from benchmarks.workloads import NOOP_ARG, NOOP_LOOP, P, memory_args

NAME = "reaktiv"
SUPPORTS = frozenset({"chain", "recombine", "wide", "tree", "noop", "memory"})


class Graph:
    """A workload as reaktiv nodes: ``change`` and the nodes that make the result."""

    __slots__ = ("change", "roots", "assemble", "keep")

    def __init__(self, change, roots, assemble, keep=None):
        self.change = change
        self.roots = roots
        self.assemble = assemble
        self.keep = keep


def _set_single(x):
    def change(step):
        x.set(step[1])
    return change


def _one(values):
    return values[0]


def _chain(wl):
    x = Signal(wl.initial()[0])
    nodes = []
    prev = None
    for _ in range(wl.size):
        if prev is None:
            c = Computed(lambda: x() + 1)
        else:
            c = Computed(lambda p=prev: p() + 1)
        c()                 # bottom-up, so that no first read nests deeper than one link
        nodes.append(c)
        prev = c
    return Graph(_set_single(x), [prev], _one, nodes)


def _recombine(wl):
    x = Signal(wl.initial()[0])
    a = Computed(lambda: x() + 1)
    b = Computed(lambda: 2 * x())
    a(), b()
    nodes = [(a, b)]
    for _ in range(wl.size - 1):
        a, b = (Computed(lambda a=a, b=b: (a() + b()) % P),
                Computed(lambda a=a, b=b: (a() - b()) % P))
        a(), b()
        nodes.append((a, b))
    return Graph(_set_single(x), [a, b], tuple, nodes)


def _wide(wl):
    x = Signal(wl.initial()[0])
    nodes = [Computed(lambda i=i: x() * i + 1) for i in range(wl.size)]
    for c in nodes:
        c()
    return Graph(_set_single(x), nodes, list)


def _tree(wl):
    leaves = [Signal(v) for v in wl.initial()]

    def t(lo, hi):
        if hi - lo == 1:
            s = leaves[lo]
            return Computed(lambda: s())    # a node per leaf, as incr's t(i, i+1)
        mid = (lo + hi) // 2
        left, right = t(lo, mid), t(mid, hi)
        return Computed(lambda: left() + right())

    root = t(0, wl.size)
    root()

    def change(step):
        leaves[step[0]].set(step[1])
    return Graph(change, [root], _one, leaves)


def _noop(wl):
    x = Signal(wl.initial()[0])
    f = Computed(lambda: x() + NOOP_ARG)
    f()
    return Graph(lambda step: None, [f], _one)


def _memory(wl):
    x = Signal(wl.initial()[0])

    def f():
        return x()          # one shared function and a shared value: only node memory counts

    nodes = []
    for _ in memory_args(wl.size):
        c = Computed(f)
        c()
        nodes.append(c)
    return Graph(lambda step: None, [], lambda vs: len(nodes), nodes)


_BUILDERS = {"chain": _chain, "recombine": _recombine, "wide": _wide, "tree": _tree,
             "noop": _noop, "memory": _memory}


def graph(wl) -> Graph:
    """The reaktiv nodes of ``wl``, computed once; shared with ``reaktiv_effect``."""
    if wl.kind not in _BUILDERS:
        raise NotImplementedError(f"reaktiv does not implement {wl.kind}")
    return _BUILDERS[wl.kind](wl)


def reader(wl, g: Graph):
    if wl.kind == "noop":
        f = g.roots[0]

        def read():
            for _ in NOOP_LOOP:
                f(); f(); f(); f(); f(); f(); f(); f(); f(); v = f()  # noqa: E702
            return v
        return read
    roots = g.roots
    assemble = g.assemble
    if len(roots) == 1:
        return roots[0]
    return lambda: assemble([c() for c in roots])


def build(wl):
    if wl.kind not in SUPPORTS:
        raise NotImplementedError(f"{NAME} does not implement {wl.kind}")
    g = graph(wl)
    if wl.kind == "memory":
        return State(g.change, lambda: g.assemble(()), g)
    return State(g.change, reader(wl, g), g)


def change(state, step):
    state.change(step)


def read(state):
    return state.read()
