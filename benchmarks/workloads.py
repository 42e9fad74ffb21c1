"""Seeded workload generators: what each benchmark computes, independent of any peer.

A workload is a frozen description (kind, size, seed). It gives every peer the same initial
input values and the same sequence of single-input changes (steps), drawn from a random
generator seeded by the workload itself, so two runs, and two peers, see identical work.
Each peer turns a workload into its own structure (``build``), applies one step at a time
(``change``) and produces the result (``read``); see ``peers/__init__.py``.

The computations (every peer implements exactly these; ``digest`` checks that they agree):

chain        N cells in a line. c0 = x + 1, c_i = c_{i-1} + 1. Step: a new x. Result: c_{N-1}.
             Every step recomputes all N cells (Jane Street's "Trivial" benchmark).
recombine    A ladder of N levels with two nodes each; both nodes of a level read both nodes
             of the level below: a_i = (a + b) % P, b_i = (a - b) % P, from a_0 = x + 1,
             b_0 = 2x. Step: a new x. Result: (a_{N-1}, b_{N-1}). Every step recomputes all
             2N nodes, each of which recombines two changed values.
wide         One input x read by N cells w(i) = x * i + 1, all of them part of the result.
             Step: a new x. Result: [w(0) .. w(N-1)].
tree         A balanced binary tree of sums over N inputs: t(lo, hi) = t(lo, mid) + t(mid, hi),
             t(i, i+1) = x_i. Step: one x_i gets a new value. Result: t(0, N).
noop         Demand of a value that is already up to date: f(i) = x + i, called with i = 7,
             CALLS_PER_READ times per read; there is no change between reads.
list_map     SAC-style map over N inputs: m(i) = 3 * x_i + 1 per element. Step: one x_i
             changes. Result: the mapped sequence (as the peer keeps it; digest flattens).
list_filter  Filter over N inputs keeping x_i % 3 == 0. Step: one x_i changes. Result: the
             kept values in input order.
list_sum     Sum over N inputs (incremental peers: a tree of cells over chunks of CHUNK
             inputs). Step: one x_i changes. Result: the sum.
memory       N instances f(i) = x, i in 0..N-1, each read one input. No steps: the measure is
             bytes kept per instance after building.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

P = 1_000_003           # modulus of the recombine ladder
CALLS_PER_READ = 1000   # demands per read in the noop workload
CHUNK = 64              # inputs per leaf cell in list_filter / list_sum / list_map's gather
NOOP_ARG = 7
NOOP_LOOP = range(CALLS_PER_READ // 10)  # peers unroll ten demands per turn of this loop

KINDS = ("chain", "recombine", "wide", "tree", "noop", "list_map", "list_filter",
         "list_sum", "memory")

# one input whose value every step replaces, versus N inputs of which a step replaces one
_SINGLE_INPUT = {"chain", "recombine", "wide", "noop", "memory"}

# what "per unit" means: the op is divided by units_per_op to give a time per unit
_UNITS = {
    "chain": "recomputed cell",
    "recombine": "recomputed node",
    "wide": "recomputed cell",
    "tree": "change",
    "noop": "demand",
    "list_map": "change",
    "list_filter": "change",
    "list_sum": "change",
    "memory": "instance",
}


@dataclass(frozen=True)
class Workload:
    kind: str
    size: int
    seed: int = 20240601

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown workload kind {self.kind!r}; known: {', '.join(KINDS)}")
        if self.size < 1:
            raise ValueError(f"workload size must be >= 1, got {self.size}")

    @property
    def label(self) -> str:
        return f"{self.kind}[{self.size}]"

    @property
    def unit(self) -> str:
        return _UNITS[self.kind]

    @property
    def units_per_op(self) -> int:
        """How many units one op (one change + one read) stands for."""
        if self.kind == "chain" or self.kind == "wide":
            return self.size
        if self.kind == "recombine":
            return 2 * self.size
        if self.kind == "noop":
            return CALLS_PER_READ
        return 1

    def rng(self, purpose: str) -> random.Random:
        # str seeds are hashed with SHA-512 by random.seed (version 2): stable across runs
        return random.Random(f"{self.kind}/{self.size}/{self.seed}/{purpose}")

    def initial(self) -> list[int]:
        """Initial values of the inputs: one value for single-input workloads, else N."""
        r = self.rng("initial")
        n = 1 if self.kind in _SINGLE_INPUT else self.size
        return [r.randrange(1000) for _ in range(n)]

    def steps(self) -> "Steps":
        return Steps(self)

    def digest(self, result) -> str:
        """A short fingerprint of a read's result, in a peer-independent form."""
        return hashlib.sha1(repr(canonical(self.kind, result)).encode()).hexdigest()[:12]


class Steps:
    """An endless, seeded sequence of changes: (input index, new value) pairs.

    Every step gives its input a value different from its current one, so that every step is
    a real change for every peer (an equal value would be a no-op for incr and not for plain
    Python).
    """

    def __init__(self, wl: Workload):
        self.wl = wl
        self.values = wl.initial()
        self.rng = wl.rng("steps")

    def take(self, k: int) -> list:
        if self.wl.kind in ("noop", "memory"):
            return [None] * k
        out = []
        vals = self.values
        r = self.rng
        n = len(vals)
        for _ in range(k):
            i = r.randrange(n) if n > 1 else 0
            v = r.randrange(1000)
            if v == vals[i]:
                v = (v + 1) % 1000
            vals[i] = v
            out.append((i, v))
        return out


_memory_args: dict[int, list[int]] = {}


def memory_args(n: int) -> list[int]:
    """The arguments 0..n-1 of the memory workload, made once per process.

    The runner calls this before it starts counting allocations, so the int objects (the
    caller's data, not the engine's) are not charged to the peer that keeps them.
    """
    a = _memory_args.get(n)
    if a is None:
        a = _memory_args[n] = list(range(n))
    return a


def flatten(rope) -> list:
    """Flatten a rope (nested tuples / lists of ints) into a list, iteratively."""
    out = []
    stack = [rope]
    while stack:
        x = stack.pop()
        if isinstance(x, (tuple, list)):
            stack.extend(reversed(x))
        else:
            out.append(x)
    return out


def canonical(kind: str, result):
    if kind in ("list_map", "list_filter", "wide"):
        return flatten(result)
    if kind == "recombine":
        return tuple(result)
    return result


# -- what the runner measures ----------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """One (workload, peers) line of the benchmark plan."""
    workload: Workload
    peers: tuple


ALL_TIME_PEERS = ("incr", "incr_observe", "plain", "reaktiv", "reaktiv_effect")
NO_EFFECT = ("incr", "incr_observe", "plain", "reaktiv")


def plan(quick: bool) -> list[Plan]:
    """The benchmark plan: which workloads at which sizes, with which peers.

    Peers are left out of a size only where they cannot run it in reasonable time or at all
    (see docs/performance.md); the reaktiv peers are still attempted at the large chain, to
    show the failure.
    """
    W = Workload
    inc = ("incr", "incr_observe")
    if quick:
        return [
            Plan(W("chain", 300), ALL_TIME_PEERS),
            Plan(W("chain", 10_000), inc + ("plain", "reaktiv")),
            Plan(W("recombine", 10), ALL_TIME_PEERS),
            Plan(W("recombine", 100), NO_EFFECT),
            Plan(W("wide", 1_000), ALL_TIME_PEERS),
            Plan(W("tree", 1_000), ALL_TIME_PEERS),
            Plan(W("tree", 10_000), inc + ("plain",)),
            Plan(W("noop", 1), ("incr", "lru", "plain", "reaktiv")),
            Plan(W("list_map", 10_000), inc + ("plain",)),
            Plan(W("list_filter", 10_000), inc + ("plain",)),
            Plan(W("list_sum", 10_000), inc + ("plain",)),
            Plan(W("memory", 100_000), ("incr", "lru")),
        ]
    return [
        Plan(W("chain", 300), ALL_TIME_PEERS),
        Plan(W("chain", 100_000), inc + ("plain", "reaktiv")),
        Plan(W("recombine", 10), ALL_TIME_PEERS),
        Plan(W("recombine", 14), ALL_TIME_PEERS),
        # reaktiv_effect's notification doubles per level (2^N): not attempted at 150
        Plan(W("recombine", 150), NO_EFFECT),
        Plan(W("recombine", 10_000), inc + ("plain",)),
        Plan(W("wide", 1_000), ALL_TIME_PEERS),
        Plan(W("wide", 10_000), inc + ("plain", "reaktiv")),  # 10^4 effects: left out for time
        Plan(W("tree", 1_000), ALL_TIME_PEERS),
        Plan(W("tree", 10_000), ALL_TIME_PEERS),
        # reaktiv by pull walks the whole tree on every read (O(N)): the effect peer stands in
        Plan(W("tree", 100_000), inc + ("plain", "reaktiv_effect")),
        Plan(W("noop", 1), ("incr", "lru", "plain", "reaktiv")),
        # the SAC list suite compares with from-scratch Python (reaktiv has no adapter for it)
        Plan(W("list_map", 100_000), inc + ("plain",)),
        Plan(W("list_filter", 100_000), inc + ("plain",)),
        Plan(W("list_sum", 100_000), inc + ("plain",)),
        Plan(W("memory", 100_000), ("incr", "lru", "reaktiv")),
        Plan(W("memory", 1_000_000), ("incr", "lru")),
    ]
