"""Every collection operator against plain from-scratch evaluation, after random set / delete /
update steps, with a random pipeline drawn at the start; asserts which map instances ran (exactly
the keys whose value changed, less those whose (key, value) instance the engine already holds)
the trace invariants, and that the map holds exactly one instance per present key (a deleted
key's instance, and the instance of a changed key's old value, are withdrawn: rt._drop)."""

from __future__ import annotations

import heapq

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import incr

KEYS = st.integers(0, 11)
VALUES = st.integers(-20, 20)

# the random pipeline: a chain of per-key stages (incremental op, plain from-scratch op)
STAGES = {
    "map_sq": (lambda m, c: m.map(c["sq"]),
               lambda d: {k: v * v - k for k, v in d.items()}),
    "filter_odd": (lambda m, c: m.filter(lambda k, v: v % 2 == 1),
                   lambda d: {k: v for k, v in d.items() if v % 2 == 1}),
    "shift_keys": (lambda m, c: m.map_keys(lambda k: k + 100),
                   lambda d: {k + 100: v for k, v in d.items()}),
    "map_plain": (lambda m, c: m.map(lambda k, v: v // 3),
                  lambda d: {k: v // 3 for k, v in d.items()}),
}
FOLDS = {
    "sum": (lambda m: m.sum(), lambda d: sum(d[k] for k in sorted(d))),
    "count": (lambda m: m.count(), lambda d: len(d)),
    "min": (lambda m: m.min(), lambda d: min(d.values(), default=None)),
    "max": (lambda m: m.max(), lambda d: max(d.values(), default=None)),
    "top3": (lambda m: m.top_k(3), lambda d: tuple(heapq.nlargest(3, sorted(d.items()),
                                                                  key=lambda kv: kv[1]))),
    "top2neg": (lambda m: m.top_k(2, key=lambda v: -v),
                lambda d: tuple(heapq.nlargest(2, sorted(d.items()), key=lambda kv: -kv[1]))),
    "reduce": (lambda m: m.map(lambda k, v: str(v)).reduce(lambda a, b: a + "," + b, ""),
               lambda d: ",".join(str(d[k]) for k in sorted(d))),
    "fold": (lambda m: m.fold(lambda a, k, v: a + k * v, lambda a, k, v: a - k * v, 0),
             lambda d: sum(k * v for k, v in d.items())),
}


class CollectionsMachine(RuleBasedStateMachine):
    @initialize(a=st.dictionaries(KEYS, VALUES, max_size=8),
                b=st.dictionaries(KEYS, VALUES, max_size=8),
                chain=st.lists(st.sampled_from(sorted(STAGES)), min_size=1, max_size=3),
                fold=st.sampled_from(sorted(FOLDS)))
    def setup(self, a, b, chain, fold):
        self.rt = incr.Runtime()
        self.a, self.b = dict(a), dict(b)
        self.ran = []
        ran = self.ran

        @incr.cell
        def f(k, v):
            ran.append(k)
            return v * 2 + k

        @incr.cell
        def sq(k, v):
            return v * v - k

        self.A = incr.input_map(self.rt, "A", a)
        self.B = incr.input_map(self.rt, "B", b)
        A, B = self.A, self.B
        fa = A.map(f)
        self.checks = {
            "A": (A, lambda: self.a),
            "map": (fa, lambda: {k: v * 2 + k for k, v in self.a.items()}),
            "filter": (A.filter(lambda k, v: v > 0), lambda: {k: v for k, v in self.a.items()
                                                             if v > 0}),
            "map_keys": (A.map_keys(lambda k: -k), lambda: {-k: v for k, v in self.a.items()}),
            "join": (A.join(B), lambda: {k: (v, self.b[k]) for k, v in self.a.items()
                                         if k in self.b}),
            "left": (A.join(B, "left"), lambda: {k: (v, self.b.get(k))
                                                 for k, v in self.a.items()}),
            "outer": (A.join(B, "outer"),
                      lambda: {k: (self.a.get(k), self.b.get(k)) for k in set(self.a) | set(self.b)}),
            "group": (A.group_by(lambda k, v: v % 3),
                      lambda: {g: {k: v for k, v in sorted(self.a.items()) if v % 3 == g}
                               for g in {v % 3 for v in self.a.values()}}),
        }
        for name, (inc, plain) in FOLDS.items():
            self.checks["fold_" + name] = (inc(fa), lambda plain=plain: plain(
                {k: v * 2 + k for k, v in self.a.items()}))
        # the random pipeline
        m, plain_chain = A, []
        cells = {"sq": sq}
        for s in chain:
            m = STAGES[s][0](m, cells)
            plain_chain.append(STAGES[s][1])

        def scratch():
            d = dict(self.a)
            for p in plain_chain:
                d = p(d)
            return d

        self.checks["pipeline"] = (m, scratch)
        inc_fold, plain_fold = FOLDS[fold]
        self.checks["pipeline_fold"] = (inc_fold(m), lambda: plain_fold(scratch()))
        self.obs = {name: self.rt.observe(node) for name, (node, _) in self.checks.items()}
        self.rt.stabilize()
        assert sorted(self.ran) == sorted(self.a)
        self.f = f
        self.expect_ran = []

    def _expect(self, pairs):
        # a changed key runs its own instance: the engine holds one instance per present key
        # (the one for its current value), so a key set back to an earlier value runs again
        held = set(self.a.items())
        self.expect_ran = [k for k, v in pairs if (k, v) not in held]

    def _step(self):
        self.ran.clear()
        self.rt.stabilize()
        assert sorted(self.ran) == sorted(self.expect_ran), (self.ran, self.expect_ran)

    @rule(k=KEYS, v=VALUES, which=st.booleans())
    def set(self, k, v, which):
        m, d = (self.A, self.a) if which else (self.B, self.b)
        self._expect([(k, v)] if which and d.get(k) != v else [])
        m.set(k, v)
        d[k] = v
        self._step()

    @rule(k=KEYS, which=st.booleans())
    def delete(self, k, which):
        m, d = (self.A, self.a) if which else (self.B, self.b)
        self.expect_ran = []
        if k in d:
            m.delete(k)
            del d[k]
        self._step()

    @rule(changes=st.dictionaries(KEYS, VALUES, max_size=4), dels=st.lists(KEYS, max_size=3))
    def update(self, changes, dels):
        self._expect([(k, v) for k, v in changes.items() if self.a.get(k) != v and k not in dels])
        rev = self.rt.revision
        self.A.update(changes, delete=dels)
        self.a.update(changes)
        for k in dels:
            self.a.pop(k, None)
        assert self.rt.revision - rev <= 1
        self._step()

    @invariant()
    def matches_from_scratch(self):
        if not hasattr(self, "checks"):
            return
        for name, (node, plain) in self.checks.items():
            got = self.obs[name].value
            want = plain()
            if isinstance(node, incr.IncrMap):
                assert list(got) == sorted(want), name
                got = dict(got.items())
            assert got == want, (name, got, want)
        # one instance of the map's cell per present key, for its current value: nothing
        # left behind by deleted keys or old values (memory stays bounded under churn)
        held = sorted(i.args for i in self.rt._instances() if i.cell is self.f)
        assert held == sorted(self.a.items()), held
        self.rt._check()


CollectionsMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCollections = CollectionsMachine.TestCase
