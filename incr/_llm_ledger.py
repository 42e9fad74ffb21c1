"""The verdict ledger of one LLM node instance, and the acceptance decision (internal).

``st.ledger`` maps (validator id, validator version, case, candidate revision) to (verdicts,
distinct): every verdict recorded under that key, and the (kind, counterexample key) pairs among
them. A verdict for another revision is history and never moves the current status; the same
verdict twice counts once.

Invariants it keeps:
- a ledger entry is never empty, and never holds one verdict twice (_ledger_add);
- a NACK with a counterexample becomes a regression case for every later revision
  (st.regressions, with the validator that found it at the same index of st.regression_src);
- acceptance (_decision) is computed from the ledger alone: no NACK from anyone, every required
  validator with an ACK and nothing else, at least min_cases distinct ACKed cases; an ACK and a
  NACK for one candidate and case is "validator_unstable";
- an outside verdict (rt.ack, rt.nack, a Reject) is recorded whole or not at all: _snapshot
  and _restore bracket it (incr.llmnodes.outside_verdict);
- _evidence tells Runtime._check (invariant I7) what a clean instance's acceptance rests on.
"""

from __future__ import annotations

from typing import Any

from incr import events
from incr._llm_book import _emit
from incr._llm_types import NACK, _Attempt, _Node, _cex_key, _fingerprint


def _acked_by_revision(st: _Node) -> dict:
    """revision -> {(validator id, case) with ACKs and no other verdict}, this context."""
    kinds: dict = {}
    for (vid, _vv, case, rev), (vs, _d) in st.ledger.items():
        kinds.setdefault(rev, {}).setdefault((vid, case), set()).update(v.kind for v in vs)
    return {rev: {k for k, ks in per.items() if ks == {"ACK"}} for rev, per in kinds.items()}


def _cases(pairs) -> str:
    return ", ".join(f"{vid} / {case!r}" for vid, case in pairs)


def _verdicts_for(st: _Node, rev: int) -> dict:
    """(vid, case) -> list of verdicts for revision ``rev`` in the current epoch."""
    out: dict = {}
    for (vid, _vv, case, r), (vs, _d) in st.ledger.items():
        if r == rev:
            out.setdefault((vid, case), []).extend(vs)
    return out


def _decision(node: LLMNode, st: _Node) -> str | None:
    vs = _verdicts_for(st, st.revision)
    kinds: dict = {}
    for (vid, case), lst in vs.items():
        ks = {v.kind for v in lst}
        if "ACK" in ks and "NACK" in ks:
            return "validator_unstable"
        kinds[(vid, case)] = ks
    # a NACK from anyone (a validator, a recheck, rt.nack, a Reject) blocks acceptance;
    # UNKNOWN blocks it when it comes from a required validator
    nack = any("NACK" in ks for ks in kinds.values())
    required = node.accept.required if node.accept.required is not None else node.validators
    ok = not nack
    for val in required:
        mine = [ks for (vid, _c), ks in kinds.items() if vid == val.id]
        if not any("ACK" in ks for ks in mine) or any(ks - {"ACK"} for ks in mine):
            ok = False
    acked = sum(1 for ks in kinds.values() if ks == {"ACK"})
    if ok and acked >= node.accept.min_cases:
        return None
    if nack:
        return "retry"
    return "unknown"


def _best(st: _Node) -> Any:
    """The candidate (of this epoch) with the most distinct ACKed cases, or None."""
    acks: dict = {}
    for (vid, _vv, case, rev), (vs, _d) in st.ledger.items():
        if any(v.kind == "ACK" for v in vs):
            acks.setdefault(rev, set()).add((vid, case))
    best, score = None, 0
    for rev in sorted(acks):
        if len(acks[rev]) > score and rev in st.values:
            best, score = rev, len(acks[rev])
    return None if best is None else st.values[best]


def _attempt_of(st: _Node, rev: int) -> _Attempt | None:
    """The (latest) attempt that made revision ``rev``, or None."""
    for a in reversed(st.attempts):
        if a.revision == rev:
            return a
    return None


def _acked_now(st: _Node) -> bool:
    """Has the current revision at least one ACK? (Accepted with none: "unvalidated".)"""
    return any(k[3] == st.revision and any(v.kind == "ACK" for v in vs)
               for k, (vs, _d) in st.ledger.items())


def _snapshot(st: _Node) -> tuple:
    """What an outside verdict changes in a node's state, copied (see _restore)."""
    return ({k: (list(vs), set(d)) for k, (vs, d) in st.ledger.items()}, st.status, st.events,
            set(st.withdrawn), list(st.regressions), list(st.regression_src), st.withdrawals)


def _restore(st: _Node, snap: tuple) -> None:
    (st.ledger, st.status, st.events, st.withdrawn, st.regressions, st.regression_src,
     st.withdrawals) = snap


def _ledger_add(st: _Node, key: tuple, v: Any, regress: bool = True) -> bool:
    """Add verdict ``v`` under ``key`` (validator id, version, case, revision); False if the
    same verdict is there already. A NACK's counterexample becomes a regression case."""
    entry = st.ledger.get(key)
    vs, distinct = ([], set()) if entry is None else entry
    ident = (v.kind, _cex_key(v) if isinstance(v, NACK) else "")
    if ident in distinct:
        return False
    distinct.add(ident)
    vs.append(v)
    if entry is None:
        st.ledger[key] = (vs, distinct)   # never an empty entry, even if interrupted above
    if regress and isinstance(v, NACK) and v.counterexample is not None and \
            all(_cex_key(r) != _cex_key(v) for r in st.regressions):
        st.regressions.append(v)      # a regression case for every later revision
        st.regression_src.append(key[0])   # ... re-checked by the validator that found it
    return True


def _note(st: _Node, vid: str, vver: str, v, revision: int, book=None) -> bool:
    """Record an outside verdict; True when the node must run again (its current candidate
    was NACKed, or an ACK may complete its acceptance)."""
    if not _ledger_add(st, (vid, vver, v.case, revision), v):
        return False
    if revision != st.revision:
        return False                  # history: never moves the current status
    st.events += 1
    if isinstance(v, NACK):
        if st.status == "stable":
            st.withdrawals += 1
            if book is not None:
                _emit(book, events.Withdrawn(st.label, revision,
                                             f"{vid}: NACK on {v.case!r}"))
        if st.status != "failed":
            st.status = "invalid"
        if st.has_candidate:
            st.withdrawn.add(_fingerprint(st.candidate))
        if book is not None:
            # reuse="revalidate" offers only an accepted candidate: not one withdrawn since
            for n, (_cand, label) in list(book.latest.items()):
                if label == st.label:
                    book.latest.pop(n, None)
        return True
    return st.status != "stable"


def _evidence(rt, inst) -> tuple[list, list]:
    """For Runtime._check (invariant I7), on an instance that is clean (not stale, has a
    value): (problems of its own state, basis). A clean instance holds its stable candidate;
    the basis is what that candidate's acceptance rests on, as (what, node, changed_at): the
    reads made before each verdict on the current revision that this process recorded, and,
    for a node with nothing to validate with, the reads of the candidate's generation. The
    core checks that none of those nodes changed or was withdrawn since."""
    st = None if rt.llm is None else rt.llm.nodes.get(inst)
    if st is None:
        return [], []           # taken from the store and never asked about: nothing kept
    problems, basis = [], []
    if st.status != "stable":
        problems.append(f"is clean but its status is {st.status!r}")
    elif not st.has_candidate or not _same(inst.value, st.candidate):
        problems.append(f"holds {inst.value!r}, not its stable candidate {st.candidate!r}")
    for key, under in st.made_under.items():
        if key[3] == st.revision and key in st.ledger:
            what = f"the verdict {key[0]} / {key[2]!r} on revision {key[3]}"
            basis.extend((what, d, at) for d, at in under)
    node = inst.cell
    if not node.validators and (node.recheck is None or not st.regressions):
        basis.extend((f"revision {st.revision}", d, at) for d, at in st.generated_under)
    return problems, basis


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:
        return False
