"""Peers: one small adapter module per system under comparison, all with the same surface.

Each module defines

    NAME: str                       the peer's name in the table
    SUPPORTS: frozenset[str]        the workload kinds it implements
    build(workload) -> state        construct the structure, compute it once (untimed)
    change(state, step) -> None     apply one step: one input gets a new value
    read(state) -> result           bring the workload's result up to date and return it

and nothing else that the runner relies on. One op = ``change`` then ``read``; that pair is
what is timed. ``read`` must return the complete, current result (the runner checks that every
peer's result has the same digest after the same steps), so no peer can skip work by being lazy
about a part of the result nobody looks at.
"""

from __future__ import annotations

import importlib

PEERS = {
    "incr": "benchmarks.peers.incr_peer",
    "incr_observe": "benchmarks.peers.incr_observe",
    "plain": "benchmarks.peers.plain",
    "reaktiv": "benchmarks.peers.reaktiv_peer",
    "reaktiv_effect": "benchmarks.peers.reaktiv_effect",
    "lru": "benchmarks.peers.lru",
}


def load(name: str):
    try:
        return importlib.import_module(PEERS[name])
    except KeyError:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}") from None


class State:
    """What a peer's ``build`` returns: the two closures that ``change`` and ``read`` call,
    and whatever the peer wants to keep alive (``keep``)."""

    __slots__ = ("change", "read", "keep")

    def __init__(self, change, read, keep=None):
        self.change = change
        self.read = read
        self.keep = keep
