"""Tasks of the feedback benchmark: small graphs of 3-5 LLM nodes with checks (internal).

Everything here is SIMULATED and abstract: a node's answer is a set of *aspects* (one value
each, one value right); there is no SQL or prose. What the abstraction keeps is the structure
the engine is for:

- an aspect may read an upstream node's aspect (``dep``), so a wrong upstream value makes the
  downstream output wrong: the visible failure shows downstream of its cause;
- a node either *embeds* what it read (its answer carries a copy of the upstream candidate it
  was generated from: to pick up an upstream fix it must be regenerated) or *references* it
  (its output is computed from the current upstream candidate: re-validation is enough);
- an aspect may be ``env``-sensitive: its right value changes when the request changes
  mid-run (the upstream-change family);
- checks are ``visible`` (the loop sees them and their counterexamples), ``protective``
  (visible checks on easy aspects that first answers usually get right: they catch an edit
  that breaks what was right) or ``hidden`` (scoring only; never given to a loop or a model).
  A visible or protective case can be passed by special-casing it (an "overfit" edit); a
  hidden case cannot, and some aspects have only hidden checks (visible coverage < 1);
- ``where``: ``sync`` checks run in the node's own validator, ``down`` checks downstream (in
  incr, a composing cell that raises ``incr.Reject``).

Families (5 tasks + 1 control each, 30 tasks): ``chain`` (embedding chains of 3-5 nodes, the
only visible check of the propagated fact at the end), ``codegen`` (referencing chains),
``upstream`` (the request changes after round 1), ``diamond`` (two nodes share an upstream
node, a sink reads both), ``instances`` (the same graph run on 3 inputs in turn; the inputs
share the right answer of every aspect, or of all but one ``per_instance`` aspect: what
reuse across instances can exploit, and where it can mislead). A control task's first answers are all right (the simulated model
is told so): any loss there is a loop breaking a right answer.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Aspect:
    name: str
    easy: bool = False
    dep: tuple[str, str] | None = None      # (upstream node, its aspect)
    env: bool = False                        # the right value changes when env goes 1 -> 2
    per_instance: bool = False               # the right value differs between instances


@dataclass(frozen=True)
class Node:
    name: str
    aspects: tuple[Aspect, ...]
    embed: bool = True

    @property
    def reads(self) -> tuple[str, ...]:
        out: list = []
        for a in self.aspects:
            if a.dep and a.dep[0] not in out:
                out.append(a.dep[0])
        return tuple(out)

    def aspect(self, name: str) -> Aspect:
        for a in self.aspects:
            if a.name == name:
                return a
        raise KeyError(name)


@dataclass(frozen=True)
class Check:
    name: str
    node: str
    aspect: str
    kind: str            # "visible", "protective" or "hidden"
    where: str = "down"  # "sync" (the node's validator) or "down" (downstream)

    @property
    def shown(self) -> bool:
        return self.kind != "hidden"


@dataclass(frozen=True)
class Task:
    id: str
    family: str
    nodes: tuple[Node, ...]                  # topological order
    checks: tuple[Check, ...] = field(repr=False)
    control: bool = False
    env_change: bool = False
    instances: int = 1                       # the graph runs on this many inputs, in turn

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def visible(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.shown)

    @property
    def hidden_names(self) -> frozenset:
        return frozenset(c.name for c in self.checks if not c.shown)

    def downstream(self, name: str) -> tuple[str, ...]:
        """Every node that reads ``name``, directly or not, in topological order."""
        hit = {name}
        out = []
        for n in self.nodes:
            if any(r in hit for r in n.reads):
                hit.add(n.name)
                out.append(n.name)
        return tuple(out)

    def coverage(self) -> float:
        """Share of aspects with at least one visible or protective check."""
        seen = {(c.node, c.aspect) for c in self.visible}
        allasp = [(n.name, a.name) for n in self.nodes for a in n.aspects]
        return sum(1 for x in allasp if x in seen) / len(allasp)


def env_of(env: int, inst: int = 0) -> int:
    """The context code every check and prompt is computed under: the request version
    (``env``, 1 or 2) and the instance (0, 1, ...) in one int."""
    return env + 10 * inst


def right_value(a: Aspect, env: int) -> int:
    """What the request asks for: the ground truth of one aspect under context code ``env``
    (``env_of``). Instances share every aspect's answer except ``per_instance`` ones, whose
    right value alternates with the instance (instances 0 and 2 agree, 1 differs)."""
    base = 1 if (a.env and env % 10 == 2) else 0
    if a.per_instance:
        base = (base + env // 10) % 2
    return base


# --- candidates ---------------------------------------------------------------------------
# A candidate is a JSON string (incr stores and fingerprints it as text):
#   {"n": node, "own": {aspect: value}, "p": [special-cased case names], "s": style,
#    "u": {upstream node: its candidate string}}    ("u" only for embedding nodes)


@functools.lru_cache(maxsize=200_000)
def parse(cand: str) -> dict:
    return json.loads(cand)


def make(node: str, own: dict, patched=(), style: int = 0, upstream: dict | None = None) -> str:
    d = {"n": node, "own": dict(sorted(own.items())), "p": sorted(set(patched)), "s": style}
    if upstream is not None:
        d["u"] = {k: (parse(v) if v is not None else None) for k, v in sorted(upstream.items())}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _canon(d) -> str | None:
    return None if d is None else json.dumps(d, sort_keys=True, separators=(",", ":"))


def _upstream(task: Task, node: Node, cand: dict, current: dict, up: str):
    if node.embed:
        return _canon(cand.get("u", {}).get(up))
    return current.get(up)


def path(task: Task, node: str, aspect: str, cand: str, current: dict) -> list:
    """The dependency path of (node, aspect) as [(node, aspect, candidate)], checked node first,
    upstream candidates resolved as the node sees them (its embedded copy, or the current one)."""
    out = [(node, aspect, cand)]
    while True:
        n, a, c = out[-1]
        spec = task.node(n)
        asp = spec.aspect(a)
        if asp.dep is None or c is None:
            return out
        up = _upstream(task, spec, parse(c), current, asp.dep[0])
        out.append((asp.dep[0], asp.dep[1], up))


def aspect_ok(task: Task, node: str, aspect: str, cand: str, env: int, current: dict) -> bool:
    for n, a, c in path(task, node, aspect, cand, current):
        if c is None or parse(c)["own"].get(a) != right_value(task.node(n).aspect(a), env):
            return False
    return True


def fresh(task: Task, node: str, current: dict) -> bool:
    """The freshness check every loop may run (visible, structural): an embedding node's
    candidate was generated from the upstream candidates in force now."""
    spec = task.node(node)
    cand = current.get(node)
    if not spec.embed or cand is None:
        return True
    u = parse(cand).get("u", {})
    return all(_canon(u.get(r)) == current.get(r) for r in spec.reads)


def patch_key(case: str, inst: int) -> str:
    """What a special-cased ("overfit") edit records: the NACKed case of the input it was
    made for. Each instance's visible cases are its own inputs, so a candidate special-cased
    for one instance's case does not pass another instance's case of the same name."""
    return case if not inst else f"{case}@{inst}"


def check_passes(task: Task, chk: Check, current: dict, env: int) -> bool:
    cand = current.get(chk.node)
    if cand is None:
        return False
    if chk.shown and patch_key(chk.name, env // 10) in parse(cand)["p"]:
        return True                          # special-cased: visible cases only
    return aspect_ok(task, chk.node, chk.aspect, cand, env, current)


def cause(task: Task, chk: Check, current: dict, env: int) -> str:
    """The node whose regeneration the failure calls for: the most upstream node on the
    current dependency path whose own value is wrong; if every current value is right, the
    most upstream embedding node holding a stale copy (or the checked node)."""
    cur_path = []
    n, a = chk.node, chk.aspect
    while True:
        cur_path.append((n, a))
        asp = task.node(n).aspect(a)
        if asp.dep is None:
            break
        n, a = asp.dep
    wrong = [n for n, a in cur_path if current.get(n) is None
             or parse(current[n])["own"].get(a) != right_value(task.node(n).aspect(a), env)]
    if wrong:
        return wrong[-1]
    stale = [n for n, _a in cur_path[:-1] if task.node(n).embed and
             any(_canon(parse(current[n]).get("u", {}).get(r)) != current.get(r)
                 for r in task.node(n).reads)]
    return stale[-1] if stale else chk.node


def blame_path(task: Task, chk: Check) -> list:
    """[(node, aspect)] from the checked node up its dependency chain (the graph's wiring,
    which the loop's author knows)."""
    out = [(chk.node, chk.aspect)]
    while True:
        asp = task.node(out[-1][0]).aspect(out[-1][1])
        if asp.dep is None:
            return out
        out.append(asp.dep)


# --- the task set -------------------------------------------------------------------------


def _chain(tid, family, length, *, embed, env_root=False, gap=False, mid_sync=False,
           protective=True, control=False, extra_hidden=True, instances=1, vary=None):
    nodes = []
    for i in range(length):
        name = f"n{i + 1}"
        asp = [Aspect("f", dep=(f"n{i}", "f") if i else None, env=env_root and i == 0,
                      per_instance=vary == name),
               Aspect("g", easy=True)]
        if gap and i == 1:
            asp.append(Aspect("h"))          # checked by hidden cases only
        nodes.append(Node(name, tuple(asp), embed=embed))
    last = nodes[-1].name
    checks = [Check("end_f", last, "f", "visible", "down")]
    if extra_hidden:
        checks.append(Check("end_f_hidden", last, "f", "hidden", "down"))
    if mid_sync and length >= 3:
        mid = nodes[length // 2].name
        checks.append(Check(f"{mid}_f", mid, "f", "visible", "sync"))
    for n in nodes:
        checks.append(Check(f"{n.name}_g", n.name, "g", "protective" if protective else "hidden",
                            "sync"))
        checks.append(Check(f"{n.name}_g_hidden", n.name, "g", "hidden", "sync"))
        for a in n.aspects:
            if a.name == "h":
                checks.append(Check(f"{n.name}_h_hidden", n.name, "h", "hidden", "sync"))
    for n in nodes[:-1]:
        checks.append(Check(f"{n.name}_f_hidden", n.name, "f", "hidden", "sync"))
    return Task(tid, family, tuple(nodes), tuple(checks), control=control, env_change=env_root,
                instances=instances)


def _diamond(tid, *, embed, family="diamond", width=2, env_root=False, gap=False, control=False,
             sink_sync=False, instances=1):
    a = Node("a", (Aspect("f", env=env_root), Aspect("g", easy=True)), embed=embed)
    mids = [Node(f"b{i + 1}", (Aspect("f", dep=("a", "f")), Aspect("g", easy=True)) +
                 ((Aspect("h"),) if gap and i == 0 else ()), embed=embed) for i in range(width)]
    d = Node("d", tuple(Aspect(f"f{i + 1}", dep=(m.name, "f")) for i, m in enumerate(mids)) +
             (Aspect("g", easy=True),), embed=embed)
    nodes = (a, *mids, d)
    checks = []
    for i in range(width):
        checks.append(Check(f"d_f{i + 1}", "d", f"f{i + 1}", "visible",
                            "sync" if sink_sync else "down"))
        checks.append(Check(f"d_f{i + 1}_hidden", "d", f"f{i + 1}", "hidden", "down"))
    for n in nodes:
        checks.append(Check(f"{n.name}_g", n.name, "g", "protective", "sync"))
        checks.append(Check(f"{n.name}_g_hidden", n.name, "g", "hidden", "sync"))
        if n is not d:
            checks.append(Check(f"{n.name}_f_hidden", n.name, "f", "hidden", "sync"))
        if any(x.name == "h" for x in n.aspects):
            checks.append(Check(f"{n.name}_h_hidden", n.name, "h", "hidden", "sync"))
    return Task(tid, family, nodes, tuple(checks), control=control, env_change=env_root,
                instances=instances)


@functools.lru_cache(maxsize=None)
def tasks() -> tuple[Task, ...]:
    return (
        _chain("chain-3", "chain", 3, embed=True),
        _chain("chain-4", "chain", 4, embed=True),
        _chain("chain-5", "chain", 5, embed=True),
        _chain("chain-4-midcheck", "chain", 4, embed=True, mid_sync=True),
        _chain("chain-4-gap-noprotect", "chain", 4, embed=True, gap=True, protective=False),
        _chain("chain-4-control", "chain", 4, embed=True, control=True),
        _chain("codegen-3", "codegen", 3, embed=False),
        _chain("codegen-4", "codegen", 4, embed=False),
        _chain("codegen-5", "codegen", 5, embed=False),
        _chain("codegen-4-midcheck", "codegen", 4, embed=False, mid_sync=True),
        _chain("codegen-4-gap", "codegen", 4, embed=False, gap=True),
        _chain("codegen-4-control", "codegen", 4, embed=False, control=True),
        _chain("upstream-3", "upstream", 3, embed=True, env_root=True),
        _chain("upstream-4", "upstream", 4, embed=True, env_root=True),
        _chain("upstream-4-ref", "upstream", 4, embed=False, env_root=True),
        _diamond("upstream-diamond", embed=True, env_root=True, family="upstream"),
        _chain("upstream-5-ref-midcheck", "upstream", 5, embed=False, env_root=True,
               mid_sync=True),
        _chain("upstream-4-control", "upstream", 4, embed=True, env_root=True, control=True),
        _diamond("diamond-2", embed=True),
        _diamond("diamond-2-ref", embed=False),
        _diamond("diamond-3", embed=True, width=3),
        _diamond("diamond-2-gap", embed=True, gap=True),
        _diamond("diamond-2-sync", embed=False, sink_sync=True),
        _diamond("diamond-2-control", embed=True, control=True),
        _chain("instances-3", "instances", 3, embed=True, instances=3),
        _chain("instances-4-ref", "instances", 4, embed=False, instances=3),
        _chain("instances-4-vary-root", "instances", 4, embed=True, instances=3, vary="n1"),
        _chain("instances-4-ref-vary-last", "instances", 4, embed=False, instances=3,
               vary="n4"),
        _diamond("instances-diamond", embed=True, family="instances", instances=3),
        _chain("instances-3-control", "instances", 3, embed=True, instances=3, control=True),
    )
