"""Task families with executable oracles (internal to the feedback benchmark).

A task is a small graph: one input (the request, whose ``env`` can change), three or four
sibling LLM nodes, the validators the runtime sees, and one composing cell that runs the
downstream check of every node. Each node has a finite candidate space (the simulated model
draws from it; a real model may answer anything: every check below executes the candidate, so
any string can be scored). Every check is an executable oracle: a candidate passes when, run
on prepared inputs, it gives what a reference gives.

Checks come in three kinds per node:

- ``sync``: visible, run by the node's own validator;
- ``down``: visible, run downstream (the composing cell in incr raises ``incr.Reject``; in the
  late-verdict scenario it arrives through ``rt.ack``/``rt.nack`` rounds later);
- ``hidden``: used only for scoring, never shown to any loop (``hidden`` is never passed to an
  arm; tests check that no hidden case name reaches a model).

``env`` 1 is the request as first stated; ``env`` 2 is the upstream change the fault
scenario injects (NULL refunds in the orders table, user ids reused across tenants, 8-digit
order ids). Invariants: a node's correctness never depends on another node's candidate (blame
is exact: see the page for what this favours); every space holds at least two candidates
correct under env 1 and at least one wrong one.
"""

from __future__ import annotations

import ast
import functools
import re
import sqlite3
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

# --- checks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One executable case: ``run(candidate, env) -> (ok, counterexample)``."""
    name: str
    kind: str                          # "sync", "down" or "hidden"
    run: Callable[[str, int], tuple[bool, Any]] = field(compare=False, repr=False)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    family: str
    prompt: str
    space: tuple[str, ...]
    checks: tuple[Check, ...]

    @property
    def sync(self):
        return tuple(c for c in self.checks if c.kind == "sync")

    @property
    def down(self):
        return tuple(c for c in self.checks if c.kind == "down")

    @property
    def visible(self):
        return tuple(c for c in self.checks if c.kind != "hidden")

    @property
    def hidden_names(self):
        return frozenset(c.name for c in self.checks if c.kind == "hidden")


@dataclass(frozen=True)
class Task:
    id: str
    family: str
    request: str
    env_text: tuple[str, str]          # what the request says under env 1 and env 2
    nodes: tuple[NodeSpec, ...]
    control: bool = False              # the simulated model's first answers are all correct


@functools.lru_cache(maxsize=None)
def _run_check(node: NodeSpec, case: str, cand: str, env: int) -> tuple[bool, Any]:
    for c in node.checks:
        if c.name == case:
            try:
                return c.run(cand, env)
            except Exception as e:  # a candidate that crashes a check fails it
                return False, {"error": f"{type(e).__name__}: {e}"}
    raise KeyError(case)


def run_check(node: NodeSpec, case: str, cand: str, env: int) -> tuple[bool, Any]:
    """Execute one case (memoized: the oracles are pure; the cost is counted by the caller)."""
    return _run_check(node, case, cand, env)


@functools.lru_cache(maxsize=None)
def defects(node: NodeSpec, cand: str, env: int) -> frozenset:
    """Every case (visible and hidden) ``cand`` fails under ``env``: the ground truth."""
    return frozenset(c.name for c in node.checks if not run_check(node, c.name, cand, env)[0])


# --- family 1: text-to-SQL over SQLite (the refund case and its kin) -----------------------

SCHEMA = "orders(id INTEGER, customer TEXT, status TEXT, refunded INTEGER, amount REAL, day TEXT)"


def _sql(sql: str, rows) -> Any:
    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE TABLE {SCHEMA}")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)", rows)
        out = db.execute(sql).fetchall()
    finally:
        db.close()
    if len(out) == 1 and len(out[0]) == 1:
        v = out[0][0]
        return round(v, 6) if isinstance(v, float) else v
    return [list(r) for r in out]


def _rows(*spec):
    """(customer, status, refunded, amount, day) -> rows with ids."""
    return tuple((i + 1,) + tuple(r) for i, r in enumerate(spec))


def _sql_case(name, kind, reference, rows1, rows2=None):
    def run(cand, env):
        rows = rows1 if env == 1 or rows2 is None else rows2
        want = _sql(reference, rows)
        got = _sql(cand, rows)
        same = got == want or (isinstance(got, (int, float)) and isinstance(want, (int, float))
                               and abs(got - want) < 1e-6)
        return same, {"rows": [list(r) for r in rows], "expected": want, "got": got}
    return Check(name, kind, run)


_D = "2024-06-10"
PNR_REF = "SELECT COUNT(*) FROM orders WHERE status = 'paid' AND COALESCE(refunded, 0) = 0"
PAID_NOT_REFUNDED = NodeSpec(
    "paid_not_refunded", "sql",
    f"Count the paid orders that were not refunded. Table {SCHEMA}.",
    (PNR_REF,
     "SELECT COUNT(*) FROM orders WHERE status = 'paid' AND refunded IS NOT 1",
     "SELECT COUNT(*) FROM orders WHERE status = 'paid' AND refunded = 0",
     "SELECT COUNT(*) FROM orders WHERE status = 'paid'",
     "SELECT COUNT(*) FROM orders WHERE refunded = 0",
     "SELECT COUNT(DISTINCT customer) FROM orders WHERE status = 'paid' AND refunded = 0",
     "SELECT COUNT(*) FROM orders WHERE status != 'cancelled' AND refunded = 0"),
    (_sql_case("counts_paid", "sync", PNR_REF,
               _rows(("a", "paid", 0, 1, _D), ("b", "pending", 0, 1, _D), ("c", "paid", 0, 1, _D))),
     _sql_case("excludes_refunds", "down", PNR_REF,
               _rows(("a", "paid", 0, 1, _D), ("b", "paid", 1, 1, _D)),
               _rows(("a", "paid", None, 1, _D), ("b", "paid", 1, 1, _D))),
     _sql_case("repeat_customer", "hidden", PNR_REF,
               _rows(("a", "paid", 0, 1, _D), ("a", "paid", 0, 2, _D), ("b", "paid", 1, 1, _D))),
     _sql_case("other_statuses", "hidden", PNR_REF,
               _rows(("a", "shipped", 0, 1, _D), ("b", "paid", 0, 1, _D), ("c", "cancelled", 0, 1, _D)),
               _rows(("a", "shipped", None, 1, _D), ("b", "paid", None, 1, _D)))))

REF_AMT = "SELECT COALESCE(SUM(amount), 0) FROM orders WHERE refunded = 1"
REFUNDED_AMOUNT = NodeSpec(
    "refunded_amount", "sql",
    f"Total amount of refunded orders (0 when there are none). Table {SCHEMA}.",
    (REF_AMT,
     "SELECT TOTAL(amount) FROM orders WHERE refunded = 1",
     "SELECT SUM(amount) FROM orders WHERE refunded = 1",
     "SELECT COUNT(*) FROM orders WHERE refunded = 1",
     "SELECT SUM(amount) FROM orders WHERE refunded = 0",
     "SELECT COALESCE(SUM(amount), 0) FROM orders WHERE status = 'paid' AND refunded = 1"),
    (_sql_case("one_refund", "sync", REF_AMT,
               _rows(("a", "paid", 1, 15.0, _D), ("b", "paid", 0, 40.0, _D))),
     _sql_case("two_refunds", "down", REF_AMT,
               _rows(("a", "paid", 1, 15.0, _D), ("b", "paid", 1, 12.5, _D), ("c", "paid", 0, 3, _D))),
     _sql_case("no_refunds", "hidden", REF_AMT, _rows(("a", "paid", 0, 9.0, _D))),
     _sql_case("refunded_cancelled", "hidden", REF_AMT,
               _rows(("a", "cancelled", 1, 7.0, _D), ("b", "paid", 1, 1.0, _D)))))

REV_REF = ("SELECT COALESCE(SUM(amount), 0) FROM orders WHERE status = 'paid' "
           "AND COALESCE(refunded, 0) = 0 AND day >= '2024-06-01'")
PAID_REVENUE = NodeSpec(
    "paid_revenue_since_june", "sql",
    f"Revenue from paid, not refunded orders since 2024-06-01 inclusive. Table {SCHEMA}.",
    (REV_REF,
     "SELECT TOTAL(amount) FROM orders WHERE status = 'paid' AND refunded IS NOT 1 AND day >= '2024-06-01'",
     "SELECT COALESCE(SUM(amount), 0) FROM orders WHERE status = 'paid' AND refunded = 0 AND day >= '2024-06-01'",
     "SELECT COALESCE(SUM(amount), 0) FROM orders WHERE status = 'paid' AND COALESCE(refunded, 0) = 0 AND day > '2024-06-01'",
     "SELECT COALESCE(SUM(amount), 0) FROM orders WHERE status = 'paid' AND day >= '2024-06-01'",
     "SELECT COALESCE(SUM(amount), 0) FROM orders WHERE status = 'paid' AND COALESCE(refunded, 0) = 0"),
    (_sql_case("in_window", "sync", REV_REF,
               _rows(("a", "paid", 0, 10.0, "2024-06-05"), ("b", "paid", 0, 5.0, "2024-05-20"))),
     _sql_case("refund_in_window", "down", REV_REF,
               _rows(("a", "paid", 0, 10.0, "2024-06-05"), ("b", "paid", 1, 5.0, "2024-06-06")),
               _rows(("a", "paid", None, 10.0, "2024-06-05"), ("b", "paid", 1, 5.0, "2024-06-06"))),
     _sql_case("first_day", "hidden", REV_REF,
               _rows(("a", "paid", 0, 10.0, "2024-06-01"), ("b", "paid", 0, 2.0, "2024-06-02"))),
     _sql_case("null_refund", "hidden", REV_REF,
               _rows(("a", "paid", None, 4.0, "2024-06-03"), ("b", "paid", 0, 1.0, "2024-06-03")))))


# --- family 2: multi-tenant cache-key repair (the second design note) ----------------------

_ALLOWED = (ast.Expression, ast.Tuple, ast.Subscript, ast.Constant, ast.Name, ast.Load,
            ast.JoinedStr, ast.FormattedValue, ast.BinOp, ast.Add, ast.IfExp, ast.Compare,
            ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.BoolOp, ast.And, ast.Or, ast.Call)


def _expr(src: str, names: tuple[str, ...]) -> Callable:
    """Compile a small expression over ``names`` after checking every syntax node against a
    short allow-list (a real model's answer is executed, so nothing else gets through)."""
    tree = ast.parse(src.strip(), mode="eval")
    for n in ast.walk(tree):
        if not isinstance(n, _ALLOWED):
            raise ValueError(f"{type(n).__name__} is not allowed in a key expression")
        if isinstance(n, ast.Name) and n.id not in names + ("str",):
            raise ValueError(f"unknown name {n.id}")
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id == "str"):
            raise ValueError("only str() may be called")
    code = compile(tree, "<candidate>", "eval")
    return lambda *vals: eval(code, {"__builtins__": {}, "str": str}, dict(zip(names, vals)))


def _price(tenant, user, product):
    """A personalised price, the same in every process (crc32, not hash())."""
    return zlib.crc32(f"{tenant}|{user}|{product}".encode()) % 9000 / 100 + 10


def _serve(key_src: str, requests, env: int):
    """Run requests through a cache keyed by the candidate; returns (answers, backend calls).
    Under env 2 user ids are only unique within a tenant."""
    key = None if key_src.strip() == "None" else _expr(key_src, ("r",))
    cache, backend, out = {}, 0, []
    for r in requests:
        truth = _price(r["tenant"] if env == 2 else "-", r["user"], r["product"])
        k = None if key is None else key(r)
        if k is not None and k in cache:
            out.append(cache[k])
            continue
        backend += 1
        if k is not None:
            cache[k] = truth
        out.append(truth)
    truths = [_price(r["tenant"] if env == 2 else "-", r["user"], r["product"]) for r in requests]
    return out, truths, backend


def _req(tenant, user, product, ts=0):
    return {"tenant": tenant, "user": user, "product": product, "ts": ts}


def _iso(name, kind, reqs1, reqs2=None):
    def run(cand, env):
        reqs = reqs1 if env == 1 or reqs2 is None else reqs2
        got, want, _b = _serve(cand, reqs, env)
        return got == want, {"requests": reqs, "prices_expected": want, "prices_served": got}
    return Check(name, kind, run)


def _hits(name, kind, reqs, max_backend):
    def run(cand, env):
        got, want, backend = _serve(cand, reqs, env)
        ok = got == want and backend <= max_backend
        return ok, {"requests": reqs, "backend_calls": backend, "allowed": max_backend}
    return Check(name, kind, run)


_SAME = [_req("t1", 7, "p9", 1), _req("t1", 7, "p9", 2)]
CACHE_KEY = NodeSpec(
    "cache_key", "cache",
    "Python expression over the request dict r (keys tenant, user, product, ts) giving the "
    "cache key for personalised prices; None disables the cache.",
    ("(r['tenant'], r['user'], r['product'])",
     "(r['user'], r['tenant'], r['product'])",
     "(r['user'], r['product'])",
     "(r['product'], r['user'])",
     "r['product']",
     "None",
     "str(r['user']) + str(r['product'])",
     "(r['user'], r['product'], r['ts'])",
     "(r['tenant'], r['product'])"),
    (_iso("isolation_two_users", "sync", [_req("t1", 1, "p1"), _req("t1", 2, "p1")],
          [_req("t1", 1, "p1"), _req("t2", 1, "p1")]),
     _hits("same_user_hits", "down", _SAME, 1),
     _iso("no_key_collision", "hidden", [_req("t1", 1, "23"), _req("t1", 12, "3")]),
     _iso("isolation_tenants", "hidden", [_req("t1", 5, "p2"), _req("t2", 6, "p2")],
          [_req("t1", 5, "p2"), _req("t2", 5, "p2")]),
     _hits("hit_rate_trace", "hidden",
           [_req("t1", u, p, ts) for ts, (u, p) in enumerate([(1, "a"), (2, "a"), (1, "a"),
                                                              (2, "a"), (1, "b"), (1, "b")])], 3)))

TTL = NodeSpec(
    "ttl_seconds", "cache",
    "Python expression over k (the item kind: 'price', 'inventory', 'catalog', ...) giving "
    "the cache TTL in seconds: volatile data at most 300 s, catalog data at least 600 s.",
    ("3600 if k == 'catalog' else 60", "60 if k != 'catalog' else 3600",
     "60 if k == 'price' else 3600", "3600", "0", "60"),
    (Check("price_fresh", "sync", lambda c, e: ((t := _expr(c, ("k",))("price")) <= 300 and t > 0,
                                                 {"kind": "price", "ttl": _expr(c, ("k",))("price"),
                                                  "want": "0 < ttl <= 300"})),
     Check("catalog_cached", "down", lambda c, e: (_expr(c, ("k",))("catalog") >= 600,
                                                   {"kind": "catalog", "ttl": _expr(c, ("k",))("catalog"),
                                                    "want": "ttl >= 600"})),
     Check("inventory_fresh", "hidden", lambda c, e: (0 < _expr(c, ("k",))("inventory") <= 300,
                                                      {"kind": "inventory"}))))


def _ev(name, kind, event, want):
    return Check(name, kind, lambda c, e: (bool(_expr(c, ("e",))(event)) == want,
                                           {"event": event, "evict_expected": want}))


EVICT = NodeSpec(
    "evict_on", "cache",
    "Python expression over the event dict e (key type) that is True when the event must "
    "evict cached personalised prices (price changes, customer tier changes).",
    ("e['type'] in ('price_change', 'tier_change')",
     "e['type'] == 'price_change' or e['type'] == 'tier_change'",
     "e['type'] == 'price_change'", "e['type'] != 'login'", "True", "False"),
    (_ev("price_change_evicts", "sync", {"type": "price_change"}, True),
     _ev("unrelated_event_keeps", "down", {"type": "login"}, False),
     _ev("tier_change_evicts", "hidden", {"type": "tier_change"}, True),
     _ev("stock_event_keeps", "hidden", {"type": "stock_update"}, False)))


# --- family 3: input validation rules (regular expressions) --------------------------------

def _re_case(name, kind, sample, want1, want2=None):
    def run(cand, env):
        want = want1 if env == 1 or want2 is None else want2
        got = re.fullmatch(cand, sample) is not None
        return got == want, {"input": sample, "should_match": want, "matched": got}
    return Check(name, kind, run)


ORDER_ID = NodeSpec(
    "order_id_re", "regex",
    "Python regular expression (fullmatch) for order ids: 'ORD-' then 6 digits "
    "(env 2: 6 or 8 digits).",
    (r"ORD-\d{6}", r"ORD-[0-9]{6}", r"ORD-\d{6}(\d{2})?", r"ORD-\d+", r"ORD-\d{6}.*",
     r"\d{6}", r"(ORD-)?\d{6}"),
    (_re_case("accepts_plain", "sync", "ORD-123456", True),
     _re_case("eight_digits", "sync", "ORD-12345678", False, True),
     _re_case("rejects_short", "down", "ORD-12345", False),
     _re_case("rejects_seven", "hidden", "ORD-1234567", False),
     _re_case("rejects_suffix", "hidden", "ORD-123456x", False),
     _re_case("rejects_bare", "hidden", "123456", False)))

ZIP = NodeSpec(
    "zip_re", "regex", "Python regular expression (fullmatch) for US ZIP codes: 5 digits, "
    "optionally '-' and 4 digits.",
    (r"\d{5}(-\d{4})?", r"[0-9]{5}(?:-[0-9]{4})?", r"\d{5}", r"\d{5}(-\d{4})*", r"\d{5}-?\d{0,4}",
     r"\d{3,5}(-\d{4})?"),
    (_re_case("five_digits", "sync", "12345", True),
     _re_case("zip_plus_four", "down", "12345-6789", True),
     _re_case("rejects_double_ext", "hidden", "12345-6789-0000", False),
     _re_case("rejects_no_dash", "hidden", "123456789", False),
     _re_case("rejects_four_digits", "hidden", "1234", False)))

ISO_DATE = NodeSpec(
    "iso_date_re", "regex", "Python regular expression (fullmatch) for ISO dates YYYY-MM-DD "
    "with a real month (01-12) and day (01-31).",
    (r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
     r"[0-9]{4}-(0[1-9]|1[012])-(0[1-9]|[12][0-9]|3[01])",
     r"\d{4}-\d{2}-\d{2}", r"\d{4}-[01]\d-[0-3]\d", r"\d{4}-\d{1,2}-\d{1,2}",
     r"\d{4}/(0[1-9]|1[0-2])/(0[1-9]|[12]\d|3[01])"),
    (_re_case("plain_date", "sync", "2024-06-10", True),
     _re_case("rejects_month_13", "down", "2024-13-01", False),
     _re_case("rejects_month_00", "hidden", "2024-00-10", False),
     _re_case("rejects_day_32", "hidden", "2024-01-32", False),
     _re_case("rejects_short_month", "hidden", "2024-6-10", False)))


# --- the task list --------------------------------------------------------------------------

ENV_TEXT = {
    "sql": ("refunded is 0 or 1.", "refunded is 0, 1 or NULL; NULL means not refunded."),
    "cache": ("user ids are unique across tenants.", "user ids are unique only within a tenant."),
    "regex": ("order ids have 6 digits.", "order ids have 6 or 8 digits."),
}

FAMILIES = {
    "sql": (PAID_NOT_REFUNDED, REFUNDED_AMOUNT, PAID_REVENUE),
    "cache": (CACHE_KEY, TTL, EVICT),
    "regex": (ORDER_ID, ZIP, ISO_DATE),
}


def hide_down(node: NodeSpec) -> NodeSpec:
    """The same node with its downstream check moved to the hidden set (no protective test)."""
    return NodeSpec(node.name, node.family, node.prompt, node.space,
                    tuple(Check(c.name, "hidden" if c.kind == "down" else c.kind, c.run)
                          for c in node.checks))


def tasks() -> list[Task]:
    """Eight tasks: per family one ordinary task, one control (first answers all correct);
    the SQL and cache families also a larger four-node task, the cache family one task
    whose protective test (same user still hits) is hidden, not visible."""
    out = []
    for fam, nodes in FAMILIES.items():
        req = " ".join(n.prompt for n in nodes)
        out.append(Task(f"{fam}", fam, req, ENV_TEXT[fam], nodes))
        out.append(Task(f"{fam}-control", fam, req, ENV_TEXT[fam], nodes, control=True))
    out.append(Task("sql+regex", "mixed", "", (ENV_TEXT["sql"][0] + " " + ENV_TEXT["regex"][0],
                                                ENV_TEXT["sql"][1] + " " + ENV_TEXT["regex"][1]),
                    (PAID_NOT_REFUNDED, REFUNDED_AMOUNT, ORDER_ID, ISO_DATE)))
    out.append(Task("cache-no-protective-test", "cache", "", ENV_TEXT["cache"],
                    (hide_down(CACHE_KEY), TTL, EVICT)))
    for t in out:   # a case name means one check within a task (feedback carries names)
        names = [c.name for n in t.nodes for c in n.checks]
        assert len(names) == len(set(names)), t.id
    return out
