"""Hostile tests of the LLM loop's repair and control mechanisms (issue 12): the runtime-wide
budget under concurrency, events and their callbacks, escalation, keep-or-revert with random
verdicts and across a store, patches, normalize, reuse, spot checks, damping, statuses. Each
test names what it attacks; those that pass stay as regression tests."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import warnings

import pytest

import incr
from incr import events
from incr import llmnodes


class Script:
    """A scripted generator: answers in order (the last repeats); records previous/feedback."""

    def __init__(self, *answers, sleep=0.0):
        self.answers = list(answers)
        self.calls = []
        self.sleep = sleep
        self.lock = threading.Lock()

    def __call__(self, *args, previous=None, feedback=()):
        with self.lock:
            self.calls.append({"args": args, "previous": previous, "feedback": feedback})
            a = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if self.sleep:
            time.sleep(self.sleep)
        if isinstance(a, BaseException):
            raise a
        return a


def make(script, **kw):
    @incr.llm(**kw)
    def node(x, *, previous=None, feedback=()):
        return script(x, previous=previous, feedback=feedback)
    return node


def cases(*names, log=None, version="1"):
    """ACK case n if the candidate holds "+n", NACK it if it holds "-n"."""
    @incr.validator(version=version)
    def check(candidate, x):
        if log is not None:
            log.append(candidate)
        for n in names:
            if f"+{n}" in candidate:
                yield incr.ACK(n)
            elif f"-{n}" in candidate:
                yield incr.NACK(n, counterexample={"case": n, "in": candidate})
    return check


def collect(rt):
    got = []
    rt.on_event(got.append)
    return got


# --- the runtime-wide budget under concurrency ----------------------------------------------


def test_runtime_budget_seconds_count_model_calls_made_ahead_in_worker_threads():
    # Four generators run ahead in worker threads, each sleeping 0.2 s: 0.8 s of model calls
    # against a runtime-wide max_seconds of 0.5. A later call must be refused. (The replay
    # of a call made ahead must not count ~0 s in place of the real call's seconds.)
    rt = incr.Runtime(budget=incr.Budget(max_seconds=0.5), max_workers=4)
    gens = [Script("ok", sleep=0.2) for _ in range(4)]
    nodes = [make(g, version=f"s{i}") for i, g in enumerate(gens)]
    got = collect(rt)
    obs = [rt.observe(n, 0) for n in nodes]
    rt.stabilize()
    assert all(o.value == "ok" for o in obs)
    finished = [e for e in got if isinstance(e, events.GenerationFinished)]
    assert len(finished) == 4
    assert all(e.seconds >= 0.2 for e in finished), [e.seconds for e in finished]
    assert rt.llm.seconds >= 0.8
    late = Script("late")
    n5 = make(late, version="late")
    with rt, pytest.raises(incr.NotAccepted) as ei:
        n5(0)
    assert ei.value.reason == "budget" and late.calls == []


def test_attempt_seconds_of_a_call_made_ahead_are_the_calls_own():
    rt = incr.Runtime(max_workers=2)
    g = Script("ok", sleep=0.2)
    n = make(g)
    rt.observe(n, 0)
    rt.stabilize()
    assert rt.state(n, 0).attempts[0]["seconds"] >= 0.2


def test_runtime_budget_of_calls_holds_for_async_generators_under_astabilize():
    calls = []

    def amake(i):
        @incr.llm(version=f"a{i}")
        async def node(x, *, previous=None, feedback=()):
            calls.append(i)
            await asyncio.sleep(0.01)
            return f"ok{i}"
        return node

    rt = incr.Runtime(budget=incr.Budget(max_attempts=3), max_concurrency=4)
    nodes = [amake(i) for i in range(8)]
    obs = [rt.observe(n, 0) for n in nodes]

    async def main():
        try:
            await rt.astabilize()
        except incr.NotAccepted:
            pass
    asyncio.run(main())
    assert len(calls) == 3
    assert rt.llm.calls == 3
    reasons = sorted(o.error.reason for o in obs if o.error is not None)
    assert reasons == ["budget"] * 5


def test_runtime_budget_of_calls_holds_inside_incr_gather():
    rt = incr.Runtime(budget=incr.Budget(max_attempts=2), max_workers=4)
    gens = [Script("ok") for _ in range(5)]
    nodes = [make(g, version=f"g{i}") for i, g in enumerate(gens)]

    def safe(n):
        def thunk():
            try:
                return n(0)
            except incr.NotAccepted as e:
                return e.reason
        return thunk

    @incr.cell
    def many():
        return incr.gather(*[safe(n) for n in nodes])

    with rt:
        out = many()
    assert sum(len(g.calls) for g in gens) == 2
    assert sorted(out) == ["budget"] * 3 + ["ok"] * 2


def test_tokens_are_counted_once_per_call_made_ahead():
    rt = incr.Runtime(budget=incr.Budget(max_tokens=10_000), max_workers=4)
    gens = [Script(incr.Candidate("-a", tokens=10), incr.Candidate("+a", tokens=5))
            for _ in range(3)]
    nodes = [make(g, version=f"t{i}", validators=[cases("a")]) for i, g in enumerate(gens)]
    got = collect(rt)
    for n in nodes:
        rt.observe(n, 0)
    rt.stabilize()
    assert sum(len(g.calls) for g in gens) == 6
    assert rt.llm.tokens == 45 and rt.llm.calls == 6
    fin = [e for e in got if isinstance(e, events.GenerationFinished)]
    started = [e for e in got if isinstance(e, events.GenerationStarted)]
    assert len(fin) == 6 and len(started) == 6
    assert sum(e.tokens for e in fin) == 45
    for n in nodes:
        assert sum(a["tokens"] for a in rt.state(n, 0).attempts) == 15


def test_events_of_a_call_made_ahead_start_before_they_finish():
    rt = incr.Runtime(max_workers=4)
    gens = [Script("-a", "+a") for _ in range(3)]
    nodes = [make(g, version=f"o{i}", validators=[cases("a")]) for i, g in enumerate(gens)]
    got = []
    lock = threading.Lock()

    def cb(e):
        with lock:
            got.append(e)
    rt.on_event(cb)
    for n in nodes:
        rt.observe(n, 0)
    rt.stabilize()
    per: dict = {}
    for e in got:
        per.setdefault(e.label, []).append(e)
    for label, es in per.items():
        open_ = 0
        for e in es:
            if isinstance(e, events.GenerationStarted):
                open_ += 1
            elif isinstance(e, events.GenerationFinished):
                open_ -= 1
                assert open_ >= 0, (label, es)
            elif isinstance(e, (events.Verdict, events.Accepted)):
                assert open_ == 0, (label, es)


def test_attempt_seconds_of_an_async_call_made_as_a_task_are_the_calls_own():
    @incr.llm()
    async def slow(x, *, previous=None, feedback=()):
        await asyncio.sleep(0.2)
        return "ok"

    rt = incr.Runtime(budget=incr.Budget(max_seconds=100))
    got = collect(rt)
    rt.observe(slow, 0)

    async def main():
        await rt.astabilize()
    asyncio.run(main())
    fin = [e for e in got if isinstance(e, events.GenerationFinished)]
    assert len(fin) == 1 and fin[0].seconds >= 0.2
    assert rt.llm.seconds >= 0.2


# --- events: callbacks that misbehave ---------------------------------------------------------


def test_an_event_callback_that_calls_back_into_the_runtime_changes_nothing():
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")])
    rt = incr.Runtime()
    tried = []

    def meddle(e):
        if isinstance(e, events.Accepted):
            tried.append("nack")
            rt.nack(node, 0, revision=e.revision, case="meddle", counterexample=1)
    rt.on_event(meddle)
    with rt:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert node(0) == "+a"
    assert tried == ["nack"]
    assert any(issubclass(x.category, RuntimeWarning) for x in w)
    st = rt.state(node, 0)
    assert st.status == "stable" and not any(k[0].startswith("rt.nack") for k in st.checks)
    assert len(s.calls) == 2


def test_an_event_callback_may_unsubscribe_itself_and_others_while_events_are_sent():
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")])
    rt = incr.Runtime()
    first, second = [], []
    unsub = {}

    def one(e):
        first.append(e)
        unsub["one"]()
        unsub["two"]()
    unsub["one"] = rt.on_event(one)
    unsub["two"] = rt.on_event(second.append)
    with rt:
        node(0)
    assert len(first) == 1
    assert len(second) == 1          # unsubscribed during the first event: nothing after it


def test_an_event_callback_that_halts_stops_the_loop_before_its_next_call():
    s = Script("-a", "-a again", "+a")
    node = make(s, validators=[cases("a")])
    rt = incr.Runtime()

    def stop(e):
        if isinstance(e, events.Verdict) and e.verdict.kind == "NACK" and e.revision == 1:
            rt.halt("operator saw a NACK")
    rt.on_event(stop)
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "halted" and len(s.calls) == 1
    rt.resume()
    with rt:
        assert node(0) == "+a"
    # after resume the loop goes on where it stopped: revision 1 is previous
    assert [c["previous"] for c in s.calls] == [None, "-a", "-a again"]


def test_an_event_callback_called_from_worker_threads_sees_every_generation():
    rt = incr.Runtime(max_workers=4)
    gens = [Script("ok", sleep=0.01) for _ in range(6)]
    nodes = [make(g, version=f"w{i}") for i, g in enumerate(gens)]
    threads = set()
    starts = []

    def cb(e):
        if isinstance(e, events.GenerationStarted):
            threads.add(threading.current_thread().name)
            starts.append(e.label)
            try:
                rt.state(nodes[0], 0)          # calls back into the runtime: refused or not,
            except incr.IncrError:             # it must neither hang nor change the loop
                pass
    rt.on_event(cb)
    obs = [rt.observe(n, 0) for n in nodes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.stabilize()
    assert len(starts) == 6 and all(o.value == "ok" for o in obs)
    assert sum(len(g.calls) for g in gens) == 6


# --- escalation --------------------------------------------------------------------------------


def test_on_failure_returning_a_coroutine_is_refused_and_the_coroutine_closed():
    s = Script("-a")

    async def human(error):
        return "+a"
    made = []

    def escalate(error):
        made.append(human(error))
        return made[-1]
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1),
                on_failure=escalate)
    rt = incr.Runtime()
    with rt, pytest.raises(TypeError, match="on_failure"):
        node(0)
    assert len(made) == 1
    assert made[0].cr_frame is None          # closed: never left to warn "never awaited"


def test_on_failure_returning_the_same_rejected_candidate_is_validated_and_stops():
    log = []
    s = Script("-a")
    asked = []

    def same(error):
        asked.append(error.reason)
        return "-a"
    node = make(s, validators=[cases("a", log=log)], budget=incr.Budget(max_attempts=1),
                on_failure=same)
    rt = incr.Runtime()
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "budget" and asked == ["budget"]
    assert len(s.calls) == 1 and log == ["-a", "-a"]
    with rt, pytest.raises(incr.NotAccepted):
        node(0)                              # asked once per budget
    assert asked == ["budget"] and len(s.calls) == 1 and len(log) == 2


def test_on_failure_returning_a_candidate_record_keeps_its_reflection():
    s = Script("-a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1),
                on_failure=lambda e: incr.Candidate("+a by hand", rationale="human"))
    rt = incr.Runtime()
    with rt:
        assert node(0) == "+a by hand"
    a = rt.state(node, 0).attempts[-1]
    assert a["rationale"] == "human" and a["outcome"] == "accepted"


def test_on_failure_of_the_node_wins_over_the_runtimes():
    s = Script("-a")
    mine, theirs = [], []
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1),
                on_failure=lambda e: mine.append(1) or "+a node")
    rt = incr.Runtime(on_failure=lambda e: theirs.append(1) or "+a runtime")
    with rt:
        assert node(0) == "+a node"
    assert mine == [1] and theirs == []


def test_on_failure_that_demands_its_own_node_is_an_error_not_a_hang():
    s = Script("-a")
    holder = {}

    def again(error):
        return holder["node"](0)
    node = holder["node"] = make(s, validators=[cases("a")],
                                 budget=incr.Budget(max_attempts=1), on_failure=again)
    rt = incr.Runtime()
    with rt, pytest.raises(incr.IncrError):
        node(0)
    assert len(s.calls) == 1


def test_on_failure_is_not_asked_when_halted():
    s = Script("-a")
    asked = []
    node = make(s, validators=[cases("a")], on_failure=lambda e: asked.append(e) or "+a")
    rt = incr.Runtime()
    rt.halt("stop")
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "halted" and asked == [] and s.calls == []


def test_on_failure_that_raises_reaches_the_caller_and_the_next_demand_is_the_same():
    s = Script("-a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1),
                on_failure=lambda e: 1 / 0)
    rt = incr.Runtime()
    with rt, pytest.raises(ZeroDivisionError):
        node(0)
    with rt, pytest.raises((ZeroDivisionError, incr.NotAccepted)):
        node(0)
    assert len(s.calls) == 1


# --- keep or revert ------------------------------------------------------------------------------


def _coin(seed, cand, case):
    return hashlib.sha256(f"{seed}|{cand}|{case}".encode()).digest()[0]


def random_cases(seed, names):
    @incr.validator(version=f"rand{seed}")
    def check(candidate, x):
        for n in names:
            b = _coin(seed, candidate, n)
            if b < 110:
                yield incr.ACK(n)
            elif b < 230:
                yield incr.NACK(n, counterexample={"case": n, "cand": candidate})
            # else: no verdict on n this time
    return check


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("patience", [1, 3, 50])
def test_a_reverted_revision_is_never_previous_with_random_verdicts(seed, patience):
    counter = []

    def gen(x, *, previous=None, feedback=()):
        counter.append(previous)
        return f"cand-{seed}-{len(counter)}"
    node = make(gen, validators=[random_cases(seed, "abcd")], patience=patience,
                budget=incr.Budget(max_attempts=12))
    rt = incr.Runtime()
    try:
        with rt:
            node(0)
    except incr.NotAccepted:
        pass
    st = rt.state(node, 0)
    reverted = {a["candidate"] for a in st.attempts if a["outcome"] == "reverted"}
    # the call after a reverted revision builds on something else; no call ever builds on one
    assert not (set(counter) & reverted), (counter, reverted)
    # accepted only with evidence on its own revision
    if st.status == "stable":
        own = [v for k, v in st.checks.items() if k[3] == st.revision]
        assert own and all(v.kind == "ACK" for v in own)


def test_keep_or_revert_survives_a_store_round_trip(tmp_path):
    path = str(tmp_path / "s")
    s1 = Script("r1 +a -b", "r2 -a -b")
    node1 = make(s1, validators=[cases("a", "b")], patience=5, version="kr",
                 budget=incr.Budget(max_attempts=2))
    rt = incr.Runtime(store=path)
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node1(0)
    assert ei.value.reason == "budget"
    assert [a["outcome"] for a in rt.state(node1, 0).attempts] == ["rejected", "reverted"]
    rt.close()
    # a new process: the same node; new evidence from outside gives a fresh budget
    s2 = Script("r3 +a +b")
    node2 = make(s2, validators=[cases("a", "b")], patience=5, version="kr",
                 budget=incr.Budget(max_attempts=2))
    rt2 = incr.Runtime(store=path)
    rt2.nack(node2, 0, revision=2, case="ops", counterexample="from a human")
    with rt2:
        assert node2(0) == "r3 +a +b"
    assert [c["previous"] for c in s2.calls] == ["r1 +a -b"]      # the best, not r2
    rt2.close()


# --- patches ---------------------------------------------------------------------------------


def test_patch_mode_with_a_non_text_patch_costs_an_attempt_and_is_fed_back():
    s = Script("x -a\n", 12345, incr.Candidate("x +a\n"))     # then a full answer
    node = make(s, validators=[cases("a")], patch=True)
    rt = incr.Runtime()
    with rt:
        assert node(0) == "x +a\n"
    fb = [f.case for f in s.calls[2]["feedback"]]
    assert "incr.patch" in fb
    assert "did not apply" in rt.state(node, 0).attempts[1]["note"]


def test_patch_mode_with_a_huge_patch_that_does_not_apply_is_truncated_in_the_feedback():
    big = "--- a\n+++ b\n@@ -1,1 +1,1 @@\n-nope\n+" + "z" * 1_000_000 + "\n"
    s = Script("x -a\n", big, incr.Candidate("x +a\n"))
    node = make(s, validators=[cases("a")], patch=True)
    rt = incr.Runtime()
    with rt:
        assert node(0) == "x +a\n"
    nack = [f for f in s.calls[2]["feedback"] if f.case == "incr.patch"][0]
    assert len(repr(nack.counterexample)) < 10_000
    assert len(rt.state(node, 0).attempts[1]["note"]) < 10_000


def test_apply_interrupted_by_ctrl_c_leaves_the_store_as_it_was(tmp_path):
    path = str(tmp_path / "s")
    s = Script("x -a", "P")
    boom = [True]

    def apply(previous, patch):
        if boom[0]:
            boom[0] = False
            raise KeyboardInterrupt
        return previous.replace("-a", "+a")
    node = make(s, validators=[cases("a")], patch=True, apply=apply, version="ki")
    rt = incr.Runtime(store=path)
    with rt, pytest.raises(KeyboardInterrupt):
        node(0)
    rt.close()
    # as for a generator interrupted by Ctrl-C: the store keeps its last record (none)
    again = incr.Runtime(store=path)
    with pytest.raises(incr.IncrError, match="never run"):
        again.state(node, 0)
    again.close()


def test_apply_interrupted_by_ctrl_c_does_not_leave_a_phantom_attempt():
    s = Script("x -a", "P", "P")
    boom = [True]

    def apply(previous, patch):
        if boom[0]:
            boom[0] = False
            raise KeyboardInterrupt
        return previous.replace("-a", "+a")
    node = make(s, validators=[cases("a")], patch=True, apply=apply)
    rt = incr.Runtime()
    with rt, pytest.raises(KeyboardInterrupt):
        node(0)
    with rt:
        assert node(0) == "x +a"
    atts = rt.state(node, 0).attempts
    # every attempt recorded is either a candidate, or says why it has none
    assert all(a["revision"] or a["note"] for a in atts), atts


# --- normalize ----------------------------------------------------------------------------------


def test_normalize_that_raises_falls_back_to_the_candidate():
    s = Script("-a one", "+a two")
    node = make(s, validators=[cases("a")], normalize=lambda c: 1 / 0)
    rt = incr.Runtime()
    with rt:
        assert node(0) == "+a two"


def test_normalize_returning_unhashable_or_unencodable_values_works():
    class Weird:
        def __repr__(self):
            raise RuntimeError("no repr")
    for norm in (lambda c: [c], lambda c: {"k": {1, 2}}, lambda c: Weird()):
        s = Script("-a one", "+a two")
        node = make(s, validators=[cases("a")], normalize=norm)
        rt = incr.Runtime()
        with rt:
            assert node(0) == "+a two"


def test_normalize_making_everything_equal_still_validates_each_candidate():
    log = []
    s = Script("-a one", "+a two")
    node = make(s, validators=[cases("a", log=log)], normalize=lambda c: "same")
    rt = incr.Runtime()
    with rt:
        assert node(0) == "+a two"
    assert log == ["-a one", "+a two"]
    s2 = Script("-a one", "-a two", "+a three")
    node2 = make(s2, validators=[cases("a")], normalize=lambda c: "same")
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node2(0)
    assert ei.value.reason == "oscillation" and len(s2.calls) == 2


# --- reuse -------------------------------------------------------------------------------------


def test_reuse_never_accepts_without_an_ack_of_its_own():
    # validators that give no verdict for the second instance: the reused candidate must
    # not become its value on no evidence
    @incr.validator(version="1")
    def only_first(candidate, x):
        if x == 1:
            yield incr.ACK("a")
    s = Script("answer")
    node = make(s, validators=[only_first], reuse="revalidate",
                budget=incr.Budget(max_attempts=1))
    rt = incr.Runtime()
    with rt:
        assert node(1) == "answer"
        with pytest.raises(incr.NotAccepted):
            node(2)
    st = rt.state(node, 2)
    assert st.status != "stable"


def test_reuse_across_argument_types_keeps_instances_apart():
    s = Script("+a shared")
    log = []
    node = make(s, validators=[cases("a", log=log)], reuse="revalidate")
    rt = incr.Runtime()
    with rt:
        for arg in (1, "1", 1.5, (1,), None):
            assert node(arg) == "+a shared"
    assert len(s.calls) == 1 and len(log) == 5     # each validated on its own


def test_reuse_with_a_validator_reading_another_cell_depends_on_it():
    world = incr.Runtime()
    flag = world.input("flag", True)

    @incr.validator(version="1")
    def reads(candidate, x):
        yield incr.ACK("a") if flag.get() else incr.NACK("a", counterexample="flag off")
    s = Script("one", "two")
    node = make(s, validators=[reads], reuse="revalidate")
    with world:
        assert node(1) == "one"
        assert node(2) == "one"
    assert len(s.calls) == 1
    flag.set(False)
    with world, pytest.raises(incr.NotAccepted):
        node(2)
    assert world.state(node, 2).status != "stable"


# --- spot checks ------------------------------------------------------------------------------


def test_recheck_every_tiny_seconds_in_a_stabilize_loop_rechecks_not_regenerates():
    log = []
    s = Script("+a")
    node = make(s, validators=[cases("a", log=log)], recheck_every=("seconds", 1e-9))
    rt = incr.Runtime()
    obs = rt.observe(node, 0)
    for _ in range(5):
        rt.stabilize()
        assert obs.value == "+a"
    assert len(s.calls) == 1 and len(log) >= 2


def test_recheck_every_with_halt_does_not_generate():
    world = {"ok": True}

    @incr.validator(version="1")
    def v(candidate, x):
        yield incr.ACK("a") if world["ok"] else incr.NACK("a", counterexample=1)
    s = Script("one", "two")
    node = make(s, validators=[v], recheck_every=("seconds", 1e-9))
    rt = incr.Runtime()
    obs = rt.observe(node, 0)
    rt.stabilize()
    world["ok"] = False
    rt.halt("hands off")
    with pytest.raises(incr.NotAccepted):
        rt.stabilize()
    assert obs.error is not None and obs.error.reason == "halted" and len(s.calls) == 1


# --- damping ------------------------------------------------------------------------------------


def test_ctrl_c_during_a_cooldown_does_not_charge_an_attempt(monkeypatch):
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=2, cooldown=5))
    rt = incr.Runtime()
    real = time.sleep
    hits = []

    def sleep(x):
        if x > 1 and not hits:
            hits.append(x)
            raise KeyboardInterrupt
        return real(min(x, 0.01))
    monkeypatch.setattr(time, "sleep", sleep)
    with rt, pytest.raises(KeyboardInterrupt):
        node(0)
    assert len(s.calls) == 1 and hits
    with rt:
        assert node(0) == "+a"              # the interrupted wait was not a model call
    assert len(s.calls) == 2


def test_cooldown_with_an_async_generator_waits_and_counts_once():
    calls = []

    @incr.llm(validators=[cases("a")], budget=incr.Budget(cooldown=0.05, max_attempts=3))
    async def node(x, *, previous=None, feedback=()):
        calls.append(time.monotonic())
        return "-a" if len(calls) == 1 else "+a"
    rt = incr.Runtime()
    rt.observe(node, 0)

    async def main():
        await rt.astabilize()
    asyncio.run(main())
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.05


def test_a_damped_node_stays_damped_in_a_new_process(tmp_path):
    path = str(tmp_path / "s")
    s = Script("one", "two", "three")
    node = make(s, budget=incr.Budget(max_withdrawals=1), version="damp")
    rt = incr.Runtime(store=path)
    with rt:
        node(0)
        rt.nack(node, 0, revision=1, case="tone", counterexample=1)
        node(0)
        rt.nack(node, 0, revision=2, case="tone", counterexample=2)
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    assert ei.value.reason == "oscillation"
    rt.close()
    s2 = Script("four")
    node2 = make(s2, budget=incr.Budget(max_withdrawals=1), version="damp")
    rt2 = incr.Runtime(store=path)
    with rt2, pytest.raises(incr.NotAccepted) as ei:
        node2(0)
    assert ei.value.reason == "oscillation" and s2.calls == []
    rt2.close()


# --- statuses ------------------------------------------------------------------------------------


def test_state_of_a_plain_cell_that_never_ran_is_an_error_naming_it():
    @incr.cell
    def plain(x):
        return x
    rt = incr.Runtime()
    with pytest.raises(incr.IncrError, match="plain"):
        rt.state(plain, 1)


def test_state_of_a_plain_cell_that_failed_is_not_stable():
    @incr.cell
    def broken(x):
        raise ValueError("nope")
    rt = incr.Runtime()
    with rt, pytest.raises(ValueError):
        broken(1)
    assert rt.state(broken, 1).status != "stable"


def test_state_of_a_plain_cell_loaded_from_the_store_is_stable(tmp_path):
    path = str(tmp_path / "s")

    @incr.cell(version="1")
    def plain(x):
        return x * 2
    rt = incr.Runtime(store=path)
    with rt:
        plain(2)
    rt.close()
    rt2 = incr.Runtime(store=path)
    with rt2:
        assert plain(2) == 4
    st = rt2.state(plain, 2)
    assert (st.status, st.candidate) == ("stable", 4)
    rt2.close()


# decided: a candidate accepted on no ACK at all is 'unvalidated' (docs/llm.md, Statuses)
def test_a_node_accepted_on_no_ack_at_all_is_not_reported_stable():
    # Acceptance(required=()) with validators that only say UNKNOWN: the candidate is
    # accepted by the user's policy, but nothing validated it
    @incr.validator(version="1")
    def shrug(candidate, x):
        yield incr.UNKNOWN("a", "cannot tell")
    s = Script("answer")
    node = make(s, validators=[shrug], accept=incr.Acceptance(required=()))
    rt = incr.Runtime()
    with rt:
        assert node(0) == "answer"
    assert rt.state(node, 0).status == "unvalidated"


def test_a_call_refused_by_the_runtime_budget_is_not_counted_nor_announced():
    rt = incr.Runtime(budget=incr.Budget(max_attempts=1))
    got = collect(rt)
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")])
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "budget" and len(s.calls) == 1
    assert rt.llm.calls == 1 and rt.llm.generations == 1
    assert [type(e).__name__ for e in got].count("GenerationStarted") == 1
    assert ei.value.attempts == 1


def test_a_reverted_revision_is_not_previous_after_a_change_of_context():
    rt = incr.Runtime()
    topic = rt.input("topic", "t1")
    s = Script("r1 +a -b", "r2 -a -b", "r3 -a -b again", "r4 +a +b")

    @incr.llm(validators=[cases("a", "b")], patience=5, budget=incr.Budget(max_attempts=2))
    def node(x, *, previous=None, feedback=()):
        return s(topic.get(), previous=previous, feedback=feedback)
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "budget"
    assert [a["outcome"] for a in rt.state(node, 0).attempts] == ["rejected", "reverted"]
    topic.set("t2")                          # a new context: r2 (reverted) is re-validated,
    with rt:                                 # NACKed, and the loop generates again
        assert node(0) == "r4 +a +b"
    prevs = [c["previous"] for c in s.calls]
    assert "r2 -a -b" not in prevs, prevs


def test_ctrl_c_in_an_event_callback_leaves_the_node_consistent():
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")])
    rt = incr.Runtime()
    armed = [True]

    def cb(e):
        if armed[0] and isinstance(e, events.Verdict):
            armed[0] = False
            raise KeyboardInterrupt
    rt.on_event(cb)
    with rt, pytest.raises(KeyboardInterrupt):
        node(0)
    with rt:
        assert node(0) == "+a"
    st = rt.state(node, 0)
    for a in st.attempts:                    # what each attempt shows is what the ledger holds
        if a["revision"]:
            ledger = sorted((k[0], k[2], v.kind) for k, v in st.checks.items()
                            if k[3] == a["revision"])
            shown = sorted((vid, v.case, v.kind) for vid, v in a["verdicts"])
            assert ledger == shown or a["revision"] != st.revision, (ledger, shown)
    assert len(s.calls) == 2
    rt._check()


# --- what a generator reports about its own cost ----------------------------------------------


@pytest.mark.parametrize("bad", [{"tokens": -1000}, {"tokens": True}, {"tokens": "10"},
                                 {"tokens": 1.5}, {"cost": -1.0}, {"cost": float("nan")},
                                 {"cost": float("inf")}, {"cost": "free"}])
def test_a_candidate_with_an_impossible_cost_is_refused(bad):
    with pytest.raises((TypeError, ValueError), match="tokens|cost"):
        incr.Candidate("x", **bad)


def test_negative_tokens_cannot_refill_the_runtime_budget():
    answers = {1: dict(tokens=-1000), 2: dict(tokens=60), 3: dict(tokens=60), 4: dict(tokens=60)}
    made = []

    @incr.llm()
    def node(x, *, previous=None, feedback=()):
        made.append(x)
        return incr.Candidate(f"v{x}", **answers[x])
    rt = incr.Runtime(budget=incr.Budget(max_tokens=100))
    with rt:
        try:
            node(1)
        except (TypeError, ValueError):
            pass
        node(2), node(3)                     # 120 tokens: the second began under 100
        with pytest.raises(incr.NotAccepted) as ei:
            node(4)
    assert ei.value.reason == "budget" and made == [1, 2, 3]


def test_a_nan_cost_cannot_switch_the_runtime_budget_off():
    made = []

    @incr.llm()
    def node(x, *, previous=None, feedback=()):
        made.append(x)
        return incr.Candidate(f"v{x}", cost=float("nan") if x == 1 else 0.6)
    rt = incr.Runtime(budget=incr.Budget(max_cost=1.0))
    with rt:
        try:
            node(1)
        except (TypeError, ValueError):
            pass
        node(2), node(3)                     # 1.2: the second began under 1.0
        with pytest.raises(incr.NotAccepted) as ei:
            node(4)
    assert ei.value.reason == "budget" and made == [1, 2, 3]


# --- events tell what really happened -------------------------------------------------------


def test_a_failed_model_call_is_announced_as_finished_with_its_error():
    s = Script(ConnectionError("reset"), ValueError("bad prompt"))
    node = make(s, budget=incr.Budget(max_attempts=5))
    rt = incr.Runtime()
    got = collect(rt)
    llmnodes_backoff = node.backoff
    node.backoff = 0.0
    try:
        with rt, pytest.raises(ValueError):
            node(0)
    finally:
        node.backoff = llmnodes_backoff
    gen = [e for e in got if isinstance(e, (events.GenerationStarted,
                                            events.GenerationFinished))]
    assert [type(e).__name__ for e in gen] == ["GenerationStarted", "GenerationFinished"] * 2
    assert "ConnectionError" in gen[1].error and "ValueError" in gen[3].error
    assert len(s.calls) == 2


def test_a_model_call_cut_at_the_deadline_is_announced_as_finished():
    s = Script("late", sleep=0.5)
    node = make(s, budget=incr.Budget(max_seconds=0.1))
    rt = incr.Runtime()
    got = collect(rt)
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "budget"
    kinds = [type(e).__name__ for e in got if isinstance(e, (events.GenerationStarted,
                                                               events.GenerationFinished))]
    assert kinds == ["GenerationStarted", "GenerationFinished"]


def test_a_call_made_ahead_and_abandoned_at_the_deadline_does_not_eat_the_runtime_budget():
    # the node's own Budget(max_seconds=0.1) abandons its call made ahead in a worker thread;
    # the runtime-wide max_seconds (30) must count at most what that call could have taken
    rt = incr.Runtime(budget=incr.Budget(max_seconds=30), max_workers=2)
    slow = Script("late", sleep=0.5)
    n1 = make(slow, version="slow", budget=incr.Budget(max_seconds=0.1))
    o1 = rt.observe(n1, 0)
    with pytest.raises(incr.NotAccepted):
        rt.stabilize()
    assert o1.error is not None and o1.error.reason == "budget"
    quick = Script("ok")
    n2 = make(quick, version="quick")
    with rt:
        assert n2(0) == "ok"
    assert len(quick.calls) == 1


def test_a_call_made_ahead_whose_result_is_dropped_by_a_halt_still_counts():
    # the model call is made in a worker thread (and spends 500 tokens); rt.halt comes in
    # before the loop takes the result, which is dropped: the runtime's budget must still
    # count the call's tokens, and the call is announced as finished
    rt = incr.Runtime(budget=incr.Budget(max_tokens=1000), max_workers=2)

    def gen(x, *, previous=None, feedback=()):
        rt.halt("operator")
        return incr.Candidate("v", tokens=500)
    node = make(gen, version="halted-ahead")
    got = collect(rt)
    obs = rt.observe(node, 0)
    with pytest.raises(incr.NotAccepted):
        rt.stabilize()
    assert obs.error is not None and obs.error.reason == "halted"
    assert rt.llm.calls == 1 and rt.llm.tokens == 500
    kinds = [type(e).__name__ for e in got if isinstance(e, (events.GenerationStarted,
                                                               events.GenerationFinished))]
    assert kinds == ["GenerationStarted", "GenerationFinished"]


def test_ctrl_c_in_normalize_leaves_the_store_as_it_was_and_no_phantom_attempt(tmp_path):
    path = str(tmp_path / "s")
    s = Script("-a", "+a")
    boom = [0]

    def norm(c):
        boom[0] += 1
        if boom[0] == 2:                     # the second candidate's fingerprint
            raise KeyboardInterrupt
        return c
    node = make(s, validators=[cases("a")], normalize=norm, version="kn")
    rt = incr.Runtime(store=path)
    with rt, pytest.raises(KeyboardInterrupt):
        node(0)
    atts = rt.state(node, 0).attempts
    assert all(a["revision"] or a["note"] for a in atts), atts
    rt.close()
    again = incr.Runtime(store=path)
    with pytest.raises(incr.IncrError, match="never run"):
        again.state(node, 0)
    again.close()


def test_hysteresis_ignores_an_ack_while_damped_and_ends_with_the_context():
    rt = incr.Runtime()
    topic = rt.input("topic", "t1")
    s = Script("one", "two", "three", "four")

    @incr.llm(budget=incr.Budget(max_withdrawals=1))
    def node(x, *, previous=None, feedback=()):
        return s(topic.get(), previous=previous, feedback=feedback)
    with rt:
        node(0)
        rt.nack(node, 0, revision=1, case="tone", counterexample=1)
        node(0)
        rt.nack(node, 0, revision=2, case="tone", counterexample=2)
        with pytest.raises(incr.NotAccepted):
            node(0)
    assert len(s.calls) == 2
    rt.ack(node, 0, revision=2, case="human says fine")
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "oscillation" and len(s.calls) == 2
    topic.set("t2")
    with rt:
        node(0)                              # a new context: no longer damped
    assert rt.state(node, 0).status in ("stable", "unvalidated")


def test_reuse_never_offers_a_candidate_withdrawn_since():
    s = Script("+a first", "+a second")
    log = []
    node = make(s, validators=[cases("a", log=log)], reuse="revalidate")
    rt = incr.Runtime()
    with rt:
        assert node(1) == "+a first"
    rt.nack(node, 1, revision=1, case="human", counterexample="wrong for everyone")
    with rt:
        got = node(2)
    # "+a first" is no longer an accepted candidate of any instance: it is not reused
    assert got == "+a second" and len(s.calls) == 2


def test_a_halt_during_a_cooldown_wait_stops_the_next_model_call():
    rt = incr.Runtime()
    timers = []

    def gen(x, *, previous=None, feedback=()):
        gen.calls.append(previous)
        if len(gen.calls) == 1:
            t = threading.Timer(0.05, rt.halt, ("operator",))   # lands in the cooldown wait
            timers.append(t)
            t.start()
            return "-a"
        return "+a"
    gen.calls = []
    node = make(gen, validators=[cases("a")], budget=incr.Budget(cooldown=1.0))
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    for t in timers:
        t.join()
    assert ei.value.reason == "halted" and len(gen.calls) == 1
    rt.resume()
    with rt:
        assert node(0) == "+a"
    assert gen.calls == [None, "-a"]


def test_a_patch_that_is_no_codec_value_is_stored_as_text(tmp_path):
    class Edit:
        def __init__(self, old, new):
            self.old, self.new = old, new

        def __repr__(self):
            return f"Edit({self.old!r} -> {self.new!r})"
    s = Script("x -a", Edit("-a", "+a"))
    node = make(s, validators=[cases("a")], patch=True, version="edit",
                apply=lambda prev, e: prev.replace(e.old, e.new))
    path = str(tmp_path / "s")
    rt = incr.Runtime(store=path)
    with rt:
        assert node(0) == "x +a"
    rt.close()
    again = incr.Runtime(store=path)
    with again:
        assert node(0) == "x +a"
    assert len(s.calls) == 2
    atts = again.state(node, 0).attempts
    assert "Edit('-a' -> '+a')" in str(atts[1]["patch"])
    again.close()


def test_an_attempt_record_with_unprintable_fields_does_not_break_the_report():
    class Nasty:
        def __repr__(self):
            raise RuntimeError("no repr")

        def __str__(self):
            raise RuntimeError("no str")
    s = Script(incr.Candidate("-a", rationale="fine", patch=Nasty()))
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1))
    rt = incr.Runtime()
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert "whose repr() raises" in ei.value.report
