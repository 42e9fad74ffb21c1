"""An LLM node's state in the store (internal): kind-2 records of the store's ``nodes``
database, and the audit trail of the validators' identities, one record per node definition.

Invariants it keeps:
- the store never executes what it reads: payloads go through incr.keys (canonical msgpack)
  and msgpack with no extension types (_no_ext), never pickle; a value the codec cannot
  encode is kept as its repr, marked as such;
- a record is checked whole (header, format, kind, length, checksum) before any field is used;
  a damaged or foreign one is a miss (DamagedRecordWarning), never a state;
- a stored candidate that a NACK withdrew, or of a node that is not stable, is never adopted
  (_may_adopt).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import msgpack

from incr import events
from incr import keys as _keys
from incr.errors import NotAccepted
from incr.store import FORMAT, HEADER, KIND_NODE, MAGIC, MAX_RECORD, DamagedRecordWarning
from incr._llm_book import _book, _emit
from incr._llm_ledger import _acked_now
from incr._llm_report import _text
from incr._llm_types import ACK, NACK, UNKNOWN, _Attempt, _Node, _cex_key, _fingerprint


# --- persistence: the node's state in the store (kind-2 records in the ``nodes`` DB) ---------
#
# The accepted candidate itself is an ordinary entry (the node is a cell): a new process takes
# it from the store without running the loop when everything the loop read hashes the same
# (the PASS path). This record carries the rest: candidates, the ledger, the attempt log, the
# failure report and what the last run read, so that a new process resumes where the last
# one stopped. Payload values go through incr.keys (canonical msgpack, no pickle); a value
# the codec cannot encode is kept as its repr, marked as such.


def _node_of(rt, inst, create: bool) -> _Node | None:
    book = _book(rt)
    st = book.nodes.get(inst)
    if st is None:
        st = _load(rt, inst)
        if st is None and create:
            st = _Node(label=inst.label_text)
        if st is not None:
            book.nodes[inst] = st
    return st


def _enc(x: Any) -> list:
    try:
        return [0, _keys.encode(x)]
    except Exception:       # TypeError; or a registered type's encoder that fails
        return [1, repr(x)]


def _dec(x: list) -> Any:
    if type(x) is not list or len(x) != 2:
        raise ValueError("malformed value")
    if x[0] == 0 and type(x[1]) is bytes:
        return _keys.decode(x[1])
    if x[0] == 1 and type(x[1]) is str:
        return x[1]
    raise ValueError("malformed value")


def _venc(v: Any) -> list:
    if isinstance(v, ACK):
        return ["ACK", v.case, _enc(v.evidence), ""]
    if isinstance(v, NACK):
        return ["NACK", v.case, _enc(v.counterexample), v.message]
    return ["UNKNOWN", v.case, _enc(None), v.reason]


def _vdec(x: list) -> Any:
    kind, case, payload, text = x
    if type(case) is not str or type(text) is not str:
        raise ValueError("malformed verdict")
    if kind == "ACK":
        return ACK(case, _dec(payload))
    if kind == "NACK":
        return NACK(case, _dec(payload), text)
    if kind == "UNKNOWN":
        return UNKNOWN(case, text)
    raise ValueError("malformed verdict")


def _save(rt, inst, st: _Node, reads) -> None:
    ikey = rt._ikey(inst)
    if ikey is None or not st.has_candidate and st.failed is None:
        return
    refs = rt._refs(reads) if reads is not None else st.refs
    if reads is None and st.snapshot is not None:
        refs = rt._refs([d for d, _at in st.snapshot])
    f = st.failed
    best = None
    if f is not None:
        for rev, val in st.values.items():
            if val is f.best and f.best is not None:
                best = rev
    payload = {
        "label": st.label, "revision": st.revision, "status": st.status,
        "candidate": _enc(st.candidate), "has": st.has_candidate,
        "values": [[r, _enc(v)] for r, v in st.values.items()],
        "ledger": [[vid, vver, case, rev, [_venc(v) for v in vs]]
                   for (vid, vver, case, rev), (vs, _d) in st.ledger.items()],
        "history": [[list(k), _venc(v), ep] for k, v, ep in st.history[-200:]],
        "regressions": [_venc(v) for v in st.regressions],
        "attempts": [[a.revision, a.fingerprint, [_venc(v) for v in a.feedback],
                      [[vid, _venc(v)] for vid, v in a.verdicts], a.tokens, float(a.cost),
                      float(a.seconds), a.note, a.rationale, a.hypothesis, _enc(a.patch),
                      list(a.expect), a.outcome] for a in st.attempts[-100:]],
        "regression_src": list(st.regression_src),
        "unvalidated": not _acked_now(st),
        "control": [st.base, st.below, st.withdrawals, st.damped, st.escalated],
        "fingerprints": [[k, r] for k, r in st.fingerprints.items()],
        "withdrawn": sorted(st.withdrawn),
        "epoch": st.epoch, "spent": [st.spent_attempts, st.spent_tokens, float(st.spent_cost)],
        "evidence": [list(e) for e in st.evidence], "streak": st.stale_streak,
        "events": st.events, "failed_events": st.failed_events, "rejections": st.rejections,
        "failed": None if f is None else [f.reason, f.report, best, f.attempts],
        "refs": refs,
    }
    rt._store_put_node(ikey, _pack_record(payload))


def _pack_record(payload: dict) -> bytes:
    """A kind-2 record of the ``nodes`` database: header, checksum, msgpack map."""
    body = msgpack.packb(payload, use_bin_type=True)
    return HEADER.pack(MAGIC, FORMAT, KIND_NODE, len(body), _keys.checksum(body)) + body


def _unpack_record(data: bytes) -> dict:
    """The map of a kind-2 record, everything checked first (ValueError otherwise)."""
    if len(data) < HEADER.size:
        raise ValueError("shorter than a header")
    magic, fmt, kind, length, crc = HEADER.unpack_from(data)
    if magic != MAGIC or fmt != FORMAT or kind != KIND_NODE:
        raise ValueError("not an incr node record of this format")
    if length > MAX_RECORD or length != len(data) - HEADER.size:
        raise ValueError("length field does not match")
    body = data[HEADER.size:]
    if _keys.checksum(body) != crc:
        raise ValueError("checksum mismatch")
    p = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True,
                        ext_hook=_no_ext)
    if type(p) is not dict:
        raise ValueError("payload is not a map")
    return p


def _load(rt, inst) -> _Node | None:
    ikey = rt._ikey(inst)
    if ikey is None:
        return None
    data = rt._store_node(ikey)
    if data is None:
        return None
    try:
        return _unpack_node(data, inst.label_text)
    except Exception as e:   # damaged or foreign: a miss, never a state
        warnings.warn(f"incr store: the saved state of {inst.label_text} is damaged ({e}); "
                      f"it starts afresh", DamagedRecordWarning, stacklevel=3)
        return None


def _unpack_node(data: bytes, label: str) -> _Node:
    p = _unpack_record(data)
    st = _Node(label=label)
    st.revision = int(p["revision"])
    st.status = p["status"]
    if st.status not in ("active", "stable", "invalid", "failed"):
        raise ValueError("unknown status")
    st.has_candidate = bool(p["has"])
    st.candidate = _dec(p["candidate"])
    st.values = {int(r): _dec(v) for r, v in p["values"]}
    for vid, vver, case, rev, vs in p["ledger"]:
        dec = [_vdec(v) for v in vs]
        st.ledger[(vid, vver, case, int(rev))] = (
            dec, {(v.kind, _cex_key(v) if isinstance(v, NACK) else "") for v in dec})
    st.history = [(tuple(k), _vdec(v), int(ep)) for k, v, ep in p["history"]]
    st.regressions = [_vdec(v) for v in p["regressions"]]
    for row in p["attempts"]:
        rev, fp, fb, vds, tok, cost, sec, note = row[:8]
        a = _Attempt(int(rev), str(fp), tuple(_vdec(v) for v in fb),
                     [(str(vid), _vdec(v)) for vid, v in vds],
                     int(tok), float(cost), float(sec), str(note))
        if len(row) >= 13:       # reflection records (older records have none)
            a.rationale, a.hypothesis = str(row[8]), str(row[9])
            a.patch, a.expect, a.outcome = _dec(row[10]), tuple(str(x) for x in row[11]), str(row[12])
        st.attempts.append(a)
    src = p.get("regression_src")
    st.regression_src = ([str(x) for x in src] if type(src) is list
                         and len(src) == len(st.regressions) else [""] * len(st.regressions))
    st.unvalidated = p.get("unvalidated") is True
    ctl = p.get("control")
    if ctl is not None:
        st.base, st.below, st.withdrawals = int(ctl[0]), int(ctl[1]), int(ctl[2])
        st.damped, st.escalated = bool(ctl[3]), bool(ctl[4])
    st.fingerprints = {str(k): int(r) for k, r in p["fingerprints"]}
    st.withdrawn = {str(x) for x in p["withdrawn"]}
    st.epoch = int(p["epoch"])
    st.spent_attempts, st.spent_tokens, st.spent_cost = (int(p["spent"][0]),
                                                         int(p["spent"][1]),
                                                         float(p["spent"][2]))
    st.evidence = {tuple(e) for e in p["evidence"]}
    st.stale_streak = int(p["streak"])
    st.events = int(p["events"])
    st.failed_events = int(p["failed_events"])
    st.rejections = int(p["rejections"])
    if p["failed"] is not None:
        reason, report, best, attempts = p["failed"]
        st.failed = NotAccepted(label, str(reason), str(report),
                                None if best is None else st.values.get(int(best)),
                                int(attempts))
    refs = p["refs"]
    if refs is not None and type(refs) is not list:
        raise ValueError("malformed references")
    st.refs = refs
    return st


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"extension type {code} in a node record")


def _may_adopt(rt, inst, vh: bytes) -> bool:
    """May the stored value (content hash ``vh``) of this LLM node be taken from the store?
    Not when its state says the candidate was withdrawn by a NACK, or the node is not stable."""
    st = _node_of(rt, inst, create=False)
    if st is None:
        return True           # stored entries are accepted candidates
    if st.status in ("invalid", "failed"):
        return False
    for rev, val in st.values.items():
        if rt._hash_value(val) == vh:
            if _fingerprint(val) in st.withdrawn:
                return False
            # an older context's accepted candidate comes back (change and revert); what it
            # rests on is the stored trace now, checked by content hash
            st.candidate, st.revision, st.has_candidate = val, rev, True
            st.status = "stable"
            st.made_under, st.generated_under = {}, ()
    return True


# --- protected acceptance: an audit of the validators' identities, per definition ----------
#
# Validators are outside the model's reach. Their identity (id and version, or a code
# fingerprint) is part of every verdict key and of the node's context key, so a verdict made by
# another version of a validator is never evidence for the current one: it is history. What
# the store adds here is the audit trail: one record per node definition (by its qualified
# name) holding the validators' identities it last ran with, and every change seen, with the
# old and new identity and when.


def _audit_key(rt, node) -> bytes:
    return b"\x00audit:" + _keys.digest("llm", b"audit:" + node._audit_ident.encode(), rt.hash)


def _audit(rt, node) -> None:
    """Compare the node's validators with the store's record of them; record and announce
    every change (events.ValidatorChanged). Nothing to do without a store."""
    if rt.store_path is None:
        return
    key = _audit_key(rt, node)
    old = _read_audit(rt._store_node(key))
    now = {v.id: v.version for v in node.validators}
    if old is not None and old["validators"] == now:
        return
    log = [] if old is None else old["log"]
    if old is not None:
        for vid in sorted(set(old["validators"]) | set(now)):
            a, b = old["validators"].get(vid, ""), now.get(vid, "")
            if a != b:
                log.append([vid, a, b, time.time()])
                _emit(_book(rt), events.ValidatorChanged(node.name, vid, a, b))
    rt._store_put_node(key, _pack_record({"audit": node.name, "label": f"audit:{node.name}",
                                          "validators": now, "log": log[-200:]}))


def _read_audit(data: bytes | None) -> dict | None:
    """An audit record, or None (absent, or damaged: then the audit starts again)."""
    if data is None:
        return None
    try:
        p = _unpack_record(data)
        vals, log = p["validators"], p["log"]
        if type(vals) is not dict or type(log) is not list or not all(
                type(k) is str and type(v) is str for k, v in vals.items()):
            return None
        return {"name": str(p["audit"]), "validators": vals,
                "log": [[str(a), str(b), str(c), float(t)] for a, b, c, t in log]}
    except Exception:
        return None


def audits(store) -> list[dict]:
    """Every recorded change of a validator's identity (for ``incr inspect``): node, validator,
    old and new identity, time."""
    out = []
    for ikey, data in store.iter_nodes():
        a = _read_audit(data) if ikey.startswith(b"\x00audit:") else None
        if a is None:
            continue
        out.extend({"node": a["name"], "validator": vid, "old": o, "new": n, "at": t}
                   for vid, o, n, t in a["log"])
    return sorted(out, key=lambda r: r["at"])


def summaries(store) -> list[dict]:
    """One row per saved LLM node state (for ``incr inspect``): label, status, revision,
    verdicts on the current revision, attempts, failure reason; damaged ones flagged."""
    rows = []
    for ikey, data in store.iter_nodes():
        if ikey.startswith(b"\x00audit:"):
            continue                          # the validators' audit trail (audits())
        try:
            st = _unpack_node(data, "?")
            label = msgpack_label(data)
        except Exception:
            rows.append({"key": ikey.hex(), "label": None, "damaged": True})
            continue
        cur = {"ACK": 0, "NACK": 0, "UNKNOWN": 0}
        for (_vid, _vv, _case, rev), (vs, _d) in st.ledger.items():
            if rev == st.revision:
                for v in vs:
                    cur[v.kind] += 1
        rows.append({"key": ikey.hex(), "label": label, "damaged": False,
                     "status": ("unvalidated" if st.status == "stable" and st.unvalidated
                                else st.status), "revision": st.revision, "verdicts": cur,
                     "attempts": len([a for a in st.attempts if a.revision]),
                     "history": [{"revision": a.revision, "outcome": a.outcome,
                                  "candidate": _text(st.values.get(a.revision), 80),
                                  "rationale": _text(a.rationale, 80),
                                  "hypothesis": _text(a.hypothesis, 80),
                                  "patch": None if a.patch is None else _text(a.patch, 80),
                                  "note": a.note}
                                 for a in st.attempts if a.revision][-10:],
                     "regressions": len(st.regressions),
                     "reason": st.failed.reason if st.failed is not None else None})
    return sorted(rows, key=lambda r: r["label"] or "")


def msgpack_label(data: bytes) -> str:
    p = msgpack.unpackb(data[HEADER.size:], raw=False, strict_map_key=True, ext_hook=_no_ext)
    lab = p.get("label")
    return lab if type(lab) is str else "?"
