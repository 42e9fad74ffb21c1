"""``incr demo``: the SQL story of the design (docs/llm.md), on a real SQLite database.

A interprets a request into a small spec, B writes SQLite SQL from the spec, C (a validator)
runs B's SQL on prepared rows whose answers are known. The built-in scripted model first
forgets the refund filter; C's NACK carries the rows, the expected and the actual count; only
B generates again, with that counterexample; then the query runs on the real data. Changing
the data re-runs the query, not the SQL generation; a second run in a new process takes the
accepted SQL from the store and calls no model at all.

The scripted model is a stand-in, not an LLM, and the demo says so on screen.
``incr demo --model openai:NAME --base-url URL`` uses a real OpenAI-compatible endpoint.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from typing import Any, Callable

import incr

REQUEST = "How many paid orders were not refunded?"
SCHEMA = "orders(id INTEGER, status TEXT, refunded INTEGER, amount REAL)"
DATA = (
    (1, "paid", 0, 40.0), (2, "paid", 1, 15.0), (3, "pending", 0, 22.5),
    (4, "paid", 0, 9.9), (5, "cancelled", 0, 70.0),
)
MORE_DATA = DATA + ((6, "paid", 0, 31.0), (7, "paid", 1, 12.0))

# prepared rows with known answers: what validator C checks B's SQL against
CASES = (
    ("counts_paid", ((1, "paid", 0, 1.0), (2, "pending", 0, 1.0), (3, "paid", 0, 1.0)), 2),
    ("excludes_refunds", ((1, "paid", 0, 1.0), (2, "paid", 1, 1.0)), 1),
)


def _query(sql: str, rows) -> Any:
    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE TABLE {SCHEMA}")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", rows)
        out = db.execute(sql).fetchall()
    finally:
        db.close()
    return out[0][0] if len(out) == 1 and len(out[0]) == 1 else [list(r) for r in out]


class ScriptedModel:
    """A deterministic stand-in for an LLM, for the demo and the tests: it interprets the
    request correctly, and writes SQL that forgets refunds until told about them; its first
    fix drops the paid filter (a regression, which incr reverts), and its second is a minimal
    patch of the best revision."""

    name = "scripted stand-in (not an LLM)"

    def __init__(self):
        self.calls = 0

    def interpret(self, request: str, feedback: tuple) -> dict:
        self.calls += 1
        return {"measure": "count", "entity": "orders",
                "filters": ["status = paid", "not refunded"]}

    def write_sql(self, spec: dict, feedback: tuple, previous: str | None = None):
        self.calls += 1
        cases = {f.case for f in feedback}
        if "counts_paid" in cases and previous is not None:
            # told that the paid filter matters too: a minimal edit of the best revision
            from incr.patches import make_patch
            new = previous + " AND refunded = 0"
            return incr.Candidate(new, patch=make_patch(previous + "\n", new + "\n"),
                                  rationale="keep the paid filter, add the refund filter",
                                  hypothesis="refunded orders are counted",
                                  expect=("excludes_refunds",))
        if "excludes_refunds" in cases:
            return incr.Candidate("SELECT COUNT(*) FROM orders WHERE refunded = 0",
                                  rationale="refunded orders must not count",
                                  hypothesis="the refund filter is missing",
                                  expect=("excludes_refunds",))
        return "SELECT COUNT(*) FROM orders WHERE status = 'paid'"


class ChatModel:
    """The same two prompts on an OpenAI-compatible chat endpoint."""

    def __init__(self, model: str, base_url: str | None):
        from incr.openai_chat import chat_generator

        self.name = f"{model}" + (f" at {base_url}" if base_url else "")
        self.calls = 0
        self._gen = chat_generator(model, base_url=base_url,
                                   system="You are a careful data analyst. Answer with the "
                                          "requested content only, no prose, no code fences.")

    def interpret(self, request: str, feedback: tuple):
        self.calls += 1
        out = self._gen(f"Turn this request into JSON with keys measure, entity, filters "
                        f"(a list of conditions in words): {request}", previous=None,
                        feedback=feedback)
        text = out.value if isinstance(out, incr.Candidate) else out
        try:
            spec = json.loads(_strip(text))
        except ValueError:
            spec = {"raw": text}
        if isinstance(out, incr.Candidate):   # keep what the server reported it cost
            return incr.Candidate(spec, tokens=out.tokens, cost=out.cost)
        return spec

    def write_sql(self, spec: dict, feedback: tuple):
        self.calls += 1
        out = self._gen(f"Write one SQLite query over the table {SCHEMA} that answers this "
                        f"spec: {json.dumps(spec)}. Return only the SQL.", previous=None,
                        feedback=feedback)
        if isinstance(out, incr.Candidate):
            return incr.Candidate(_strip(out.value), tokens=out.tokens, cost=out.cost)
        return _strip(out)


def _strip(text: str) -> str:
    text = text.strip()
    m = re.match(r"^```[a-zA-Z]*\n(.*)\n```$", text, re.S)
    return (m.group(1) if m else text).strip()


def build(rt: incr.Runtime, model) -> dict:
    """The graph: inputs request and orders, LLM nodes interpret (A) and write_sql (B),
    validator sql_checks (C), the cell answer."""
    request = rt.input("request", REQUEST)
    orders = rt.input("orders", DATA)
    log: list = []

    @incr.validator(version="1")
    def spec_checks(spec, key):
        log.append(("V", "spec_checks"))
        ok = isinstance(spec, dict) and {"measure", "filters"} <= set(spec)
        return incr.ACK("has_measure_and_filters") if ok else incr.NACK(
            "has_measure_and_filters", counterexample={"got": spec},
            message="answer with JSON holding measure and filters")

    @incr.llm(validators=[spec_checks], version="interpret-v1",
              budget=incr.Budget(max_attempts=3))
    def interpret(key, *, previous=None, feedback=()):
        log.append(("A", "generate", len(feedback)))
        return model.interpret(request.get(), feedback)

    @incr.validator(version="1")
    def sql_checks(sql, key):
        log.append(("V", "sql_checks"))
        for case, rows, expected in CASES:
            try:
                got = _query(sql, rows)
            except sqlite3.Error as e:
                yield incr.NACK(case, counterexample={"rows": [list(r) for r in rows],
                                                      "error": str(e)},
                                message="the query does not run")
                continue
            if got == expected:
                yield incr.ACK(case)
            else:
                yield incr.NACK(case, counterexample={"rows": [list(r) for r in rows],
                                                      "expected": expected, "got": got},
                                message=f"expected {expected}, got {got}")

    @incr.llm(validators=[sql_checks], accept=incr.Acceptance(min_cases=2),
              version="write-sql-v1", budget=incr.Budget(max_attempts=4))
    def write_sql(key, *, previous=None, feedback=()):
        spec = interpret(key)
        log.append(("B", "generate", len(feedback)))
        if isinstance(model, ScriptedModel):
            return model.write_sql(spec, feedback, previous)
        return model.write_sql(spec, feedback)

    @incr.cell(version="1")
    def answer(key):
        log.append(("query",))
        return _query(write_sql(key), orders.get())

    return {"request": request, "orders": orders, "interpret": interpret,
            "write_sql": write_sql, "answer": answer, "log": log}


def run(store: str | None = ".incr", *, model_spec: str | None = None,
        base_url: str | None = None, as_json: bool = False, out=None) -> int:
    out = out or sys.stdout
    if model_spec:
        kind, _, name = model_spec.partition(":")
        if kind != "openai" or not name:
            print(f"incr demo: --model must look like openai:MODEL_NAME, got {model_spec!r}",
                  file=sys.stderr)
            return 2
        try:
            model = ChatModel(name, base_url)
        except ImportError as e:
            print(f"incr demo: {e}", file=sys.stderr)
            return 2
    else:
        model = ScriptedModel()
    try:
        rt = incr.Runtime(store=store)
    except incr.StoreError as e:
        print(f"incr demo: {e}", file=sys.stderr)
        return 1
    g = build(rt, model)
    log = g["log"]
    steps = []

    def take():
        items, log[:] = list(log), []
        return items

    def tokens() -> int:
        """Tokens the model reported, over every attempt A and B recorded (0 for the scripted
        stand-in, which reports none)."""
        from incr.llmnodes import _instance
        n = 0
        for node in (g["interpret"], g["write_sql"]):
            _inst, st = _instance(rt, node, ("q",), {}, "state")
            n += 0 if st is None else sum(a.tokens for a in st.attempts)
        return n

    tokens_before = 0

    def summarize(title, report, items, calls_before):
        gens = [f"{who} (fed back: {n} NACK{'s' if n != 1 else ''})" if n else who
                for who, what, *rest in [i for i in items if len(i) == 3]
                for n in [rest[0]]]
        steps.append({
            "step": title, "revision": rt.revision,
            "model_calls": model.calls - calls_before,
            "generated": gens,
            "validator_runs": sum(1 for i in items if i[0] == "V"),
            "tokens": tokens() - tokens_before,
            "query_ran": any(i[0] == "query" for i in items),
            "loaded": list(report.loaded) if report is not None else [],
            "answer": observer.value,
        })

    failure = None
    try:
        with rt:
            calls0 = model.calls
            try:
                observer = rt.observe(g["answer"], "q")
                rt.stabilize()                 # observing computes nothing: this pass does
            except incr.NotAccepted as e:
                failure = e
            else:
                first = [i.label_text for i in rt._instances() if i.action == "loaded"]
                summarize("first computation", None, take(), calls0)
                steps[-1]["loaded"] = sorted(first)
                st = rt.state(g["write_sql"], "q")
                nacks = [(k, v) for k, v in st.checks.items() if v.kind == "NACK"]
                steps[-1]["nacks"] = [{"revision": k[3], "case": k[2],
                                       "counterexample": v.counterexample}
                                      for k, v in nacks]
                steps[-1]["sql"] = st.candidate
                steps[-1]["sql_revision"] = st.revision
                steps[-1]["attempts"] = [
                    {"revision": a["revision"], "outcome": a["outcome"], "note": a["note"],
                     "rationale": a["rationale"], "patch": a["patch"]}
                    for a in st.attempts if a["revision"]]
                calls0, tokens_before = model.calls, tokens()
                g["orders"].set(MORE_DATA)
                report = rt.stabilize()
                summarize("the data changes: two more orders", report, take(), calls0)
            stats = rt.stats()
    finally:
        rt.close()

    if failure is not None:
        print(f"incr demo: {failure}\n{failure.report}", file=out)
        return 1
    total_calls = sum(s["model_calls"] for s in steps)
    if as_json:
        json.dump({"store": store, "model": model.name, "steps": steps, "stats": stats,
                   "model_calls": total_calls}, out, indent=2, default=repr)
        out.write("\n")
        return 0
    w = out.write
    where = f"on the store {store}" if store else "in memory"
    w(f"incr demo: text-to-SQL with validators ({where})\n")
    w(f"model: {model.name}\n")
    w(f"request: {REQUEST!r}\n")
    w("A interprets the request, B writes SQL, C checks B's SQL on prepared rows with known\n"
      "answers; the accepted SQL then runs on the orders table (SQLite). A validator run is\n"
      "one validator judging one candidate: A's spec is checked for its fields, C runs one\n"
      f"candidate SQL on its {len(CASES)} prepared cases.\n\n")
    for s in steps:
        w(f"[revision {s['revision']}] {s['step']}\n")
        w(f"    model calls: {s['model_calls']}"
          + (f" ({', '.join(s['generated'])})" if s["generated"] else "")
          + (f"; {s['tokens']} tokens (as the server reported them)"
             if isinstance(model, ChatModel) else "") + "\n")
        past = " (recorded by an earlier run)" if not s["model_calls"] else ""
        for n in s.get("nacks", ()):
            w(f"    C said NACK to B's revision {n['revision']} on {n['case']!r}{past}: "
              f"{json.dumps(n['counterexample'], sort_keys=True)}\n")
        a = sum(1 for x in s["generated"] if x.startswith("A"))
        b = sum(1 for x in s["generated"] if x.startswith("B"))
        if b > 1 and a <= 1:
            w(f"    only B was reopened by the NACK: B generated {b} times, A {a} time"
              f"{'s' if a != 1 else ''}\n")
        for a in s.get("attempts", ()):
            if a["outcome"] == "reverted":
                w(f"    B revision {a['revision']} lost a case an earlier revision passed (a "
                  f"regression): reverted, {a['note'].split('; ')[-1]}\n")
            if a["patch"]:
                added = [ln[1:] for ln in str(a["patch"]).splitlines()
                         if ln.startswith("+") and not ln.startswith("+++")]
                w(f"    B revision {a['revision']} is a minimal patch"
                  + (f" ({a['rationale']})" if a["rationale"] else "") + ": "
                  + " / ".join(added) + "\n")
        if "sql" in s:
            w(f"    accepted SQL (B revision {s['sql_revision']}): {s['sql']}\n")
        w(f"    validator runs: {s['validator_runs']}; query ran: "
          f"{'yes' if s['query_ran'] else 'no'}"
          + (f"; from the store: {', '.join(s['loaded'])}" if s["loaded"] else "") + "\n")
        w(f"    answer = {s['answer']}\n")
    w(f"\nCounters: model calls (generations) {stats['generations']}, validator runs "
      f"{stats['validations']}, from the store {stats['store_hits']}\n")
    if store:
        if total_calls == 0:
            w(f"\nThis run called the model 0 times: the accepted SQL and every result came "
              f"from {store} (written by an earlier run).\n")
        else:
            w(f"\n{total_calls} model calls this time. Run `incr demo` again: a new process "
              f"takes the accepted SQL from {store} and calls the model 0 times.\n")
    return 0
