"""The stored trace as a graph, and its drawings (``incr graph``, ``incr inspect``).

What is drawn is what the store recorded, nothing inferred:

- an **instance** (a cell called with some arguments) is one node, named by its instance key;
  its edges are the dependencies its current record(s) list, each to the instance key or the
  input name that record names (never matched by label or by function name);
- its **current** records are the ones of the last run that wrote or used it; when one run
  holds several (the instance ran again in a later revision of that run) their dependencies are
  joined: each edge is one the instance really read during that run;
- an instance is **superseded** when the same function (by name) with the same arguments has a
  newer version (a body edit, a new ``version=``) used in a later run. Superseded instances are
  left out unless ``all_versions`` (or a current instance still reads them);
- an **LLM node** carries its status (active, stable, invalid, failed) and, per validator that
  judged its current candidate revision, a **verdict edge** from the node to the validator with
  the ACK/NACK/UNKNOWN counts. Verdict edges are not dependencies and are drawn apart;
- a dependency on an instance the store no longer holds (gc dropped it, or its value could not
  be stored) is drawn as a dotted *not stored* node, so that no real dependency is hidden.

The drawings (``incr graph --format svg|html``, ``incr ui``) are laid out by Graphviz's ``dot``
(layers, what is read left of what reads it, edges routed around the boxes): ``dot`` writes the
DOT text, ``svg`` runs Graphviz on it, ``page`` is the page of both ``incr graph --format html``
(static) and ``incr ui`` (live), ``snapshot`` all it shows.
"""

from __future__ import annotations

import html as _html
import json
from typing import Any

STATUS_COLOUR = {"stable": "#bfe3c0", "active": "#fff1a8", "invalid": "#ffd1a1",
                 "failed": "#f4b4b4"}
VERDICT_COLOUR = {"ACK": "#2e7d32", "NACK": "#c62828", "UNKNOWN": "#757575"}


def _ikey_len(key: bytes) -> int:
    return 21 if key[:1] == b"b" else 17      # algorithm byte + digest (blake2b: 20, xxh3: 16)


def _name(cell: str) -> str:
    """The function's dotted name in a cell identity ``name@version``."""
    return cell.split("@", 1)[0]


def load(store, *, all_versions: bool = False) -> dict:
    """The graph of what ``store`` holds: ``{"nodes": {id: {...}}, "edges": [[from, to]...],
    "verdicts": [{"node", "validator", "ACK", "NACK", "UNKNOWN"}...]}``.

    A node has ``label``, ``kind`` (input, cell, llm, validator, missing) and, for instances,
    ``cell``, ``last_run``, ``traces``, ``superseded`` (and ``superseded_by``); an LLM node also
    ``status``, ``revision`` and ``reason``."""
    from incr.llmnodes import _unpack_node, msgpack_label

    usage = store.usage()
    recs: dict[bytes, list[tuple[int, dict]]] = {}
    for key, rec, _size in store.iter_records():
        if rec is None:
            continue
        last = max(rec["run"], usage.get(key, (0, 0))[1])
        recs.setdefault(key[:_ikey_len(key)], []).append((last, rec))

    def nid(ik: bytes) -> str:
        return "c" + ik.hex()

    nodes: dict[str, dict] = {}
    group_last: dict[tuple, tuple[int, bytes]] = {}
    for ik, rs in recs.items():
        last = max(r for r, _ in rs)
        rec = max(rs, key=lambda t: t[0])[1]
        nodes[nid(ik)] = {"label": rec["label"], "kind": "llm" if "@llm:" in rec["cell"] else "cell",
                          "cell": rec["cell"], "last_run": last, "traces": len(rs),
                          "superseded": False}
        g = (_name(rec["cell"]), bytes(rec["args"]))
        if g not in group_last or (last, ik) > group_last[g]:
            group_last[g] = (last, ik)
    for ik, rs in recs.items():
        n = nodes[nid(ik)]
        g_last, g_ik = group_last[(_name(n["cell"]), bytes(max(rs, key=lambda t: t[0])[1]["args"]))]
        if g_ik != ik and g_last > n["last_run"]:
            n["superseded"], n["superseded_by"] = True, nid(g_ik)

    edges: list[list[str]] = []
    seen: set[tuple[str, str]] = set()
    for ik, rs in recs.items():
        me = nid(ik)
        last = nodes[me]["last_run"]
        for r, rec in rs:
            if r != last:
                continue
            for kind, ref, _h in rec["deps"]:
                if kind == "i":
                    src = "i" + ref.encode().hex()   # (any name, as an id safe everywhere)
                    nodes.setdefault(src, {"label": ref, "kind": "input"})
                else:
                    dep_ik = bytes(ref[2])
                    src = nid(dep_ik)
                    if dep_ik not in recs and src not in nodes:
                        short = _name(ref[0]).rsplit(".", 1)[-1]
                        try:
                            from incr.keys import decode
                            lab = f"{short}({', '.join(repr(a) for a in decode(ref[1]))})"
                        except Exception:
                            lab = f"{short}(…)"
                        nodes[src] = {"label": lab, "kind": "missing", "cell": ref[0]}
                if (src, me) not in seen:
                    seen.add((src, me))
                    edges.append([src, me])

    by_ident = {(rs[0][1]["cell"], bytes(rs[0][1]["args"])): nid(ik) for ik, rs in recs.items()}
    verdicts = []
    for ik, data in store.iter_nodes():
        me = nid(bytes(ik))
        try:
            st = _unpack_node(data, "?")
            label = msgpack_label(data)
        except Exception:
            continue   # a damaged state: `incr inspect` reports it
        n = nodes.setdefault(me, {"label": label, "kind": "llm", "cell": "", "last_run": 0,
                                  "traces": 0, "superseded": False})
        n["kind"] = "llm"
        n.update(status=st.status, revision=st.revision,
                 reason=st.failed.reason if st.failed is not None else None)
        if not n["traces"] and isinstance(st.refs, list):
            # no value stored (it failed, or has none yet): what its last run read is in its
            # state, as references [kind, name or [identity, args], value hash]
            for ref in st.refs:
                src = _ref_node(ref, by_ident, nodes)
                if src is not None and (src, me) not in seen:
                    seen.add((src, me))
                    edges.append([src, me])
        per: dict[str, dict] = {}
        for (vid, _vv, _case, rev), (vs, _d) in st.ledger.items():
            if rev != st.revision:
                continue
            c = per.setdefault(vid, {"ACK": 0, "NACK": 0, "UNKNOWN": 0})
            for v in vs:
                c[v.kind] += 1
        for vid, c in sorted(per.items()):
            vnode = "v" + vid.encode().hex()
            nodes.setdefault(vnode, {"label": vid.rsplit(".", 1)[-1], "kind": "validator",
                                     "validator": vid})
            verdicts.append({"node": me, "validator": vnode, **c})

    if not all_versions:
        keep = {a for a, b in edges if not nodes[b].get("superseded")}
        drop = {k for k, n in nodes.items() if n.get("superseded") and k not in keep}
        edges = [e for e in edges if e[0] not in drop and e[1] not in drop]
        verdicts = [v for v in verdicts if v["node"] not in drop]
        judged = {v["validator"] for v in verdicts}
        drop |= {k for k, n in nodes.items() if n["kind"] == "validator" and k not in judged}
        for k in drop:
            del nodes[k]
        # an input only a dropped instance read is not part of the current graph either
        used = {a for a, _ in edges}
        for k in [k for k, n in nodes.items() if n["kind"] == "input" and k not in used]:
            del nodes[k]
    return {"nodes": nodes, "edges": edges, "verdicts": verdicts}


def _ref_node(ref: Any, by_ident: dict, nodes: dict) -> str | None:
    """The node id a stored reference of an LLM node's state names (an input is added to
    ``nodes``), or None if malformed or naming a cell the store holds no record of."""
    if type(ref) is not list or len(ref) != 3:
        return None
    if ref[0] == "i" and type(ref[1]) is str:
        src = "i" + ref[1].encode().hex()
        nodes.setdefault(src, {"label": ref[1], "kind": "input"})
        return src
    if ref[0] == "c" and type(ref[1]) is list and len(ref[1]) == 2:
        return by_ident.get((ref[1][0], bytes(ref[1][1])))
    return None


def mark_superseded(rows: list[dict]) -> list[dict]:
    """Set ``superseded`` on ``incr inspect``'s rows: True for an instance whose function (by
    name) with the same arguments (by label) has a newer version used in a later run."""
    newest: dict[tuple, int] = {}
    for r in rows:
        if r["cell"] is not None:
            g = (_name(r["cell"]), r["label"])
            newest[g] = max(newest.get(g, 0), r["last_run"])
    for r in rows:
        r["superseded"] = (r["cell"] is not None
                           and newest[(_name(r["cell"]), r["label"])] > r["last_run"])
    return rows


# --- DOT and Graphviz's layout -----------------------------------------------------------------


class GraphvizMissing(RuntimeError):
    """Graphviz's ``dot`` program is not installed (the layered layout needs it)."""


DOT_MISSING = ("the drawing needs Graphviz's `dot` program, which is not installed (Debian/"
               "Ubuntu: apt-get install graphviz; macOS: brew install graphviz; conda: conda "
               "install graphviz); `incr graph --format dot` and `--format json` work without it")


def _q(s: str) -> str:
    """A DOT double-quoted string. Ids are hex (see ``load``); a label is an escString, where
    a backslash escapes the next character."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


MAX_LABEL = 48    # a longer label is shortened in its box (the full one is in the details)


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[:MAX_LABEL - 1] + "…"


def dot(g: dict) -> str:
    """The graph in Graphviz's DOT language: ids are the hex node ids (quoted), every node and
    edge carries an ``id`` and a ``class`` (kept by Graphviz in its SVG, where the page finds
    them): a node ``id`` is its node id, an edge ``id`` is ``dep:FROM:TO`` or
    ``verdict:NODE:VALIDATOR``."""
    nodes = g["nodes"]
    lines = ["digraph incr {", "  rankdir=LR; nodesep=0.25; ranksep=0.6;",
             '  node [fontname="Helvetica", fontsize=11, penwidth=1.2];',
             '  edge [color="#888888", arrowsize=0.7, fontname="Helvetica"];']
    for k, n in sorted(nodes.items()):
        kind = n["kind"]
        label = _short(n["label"])
        attrs = {"id": k, "class": f"kind-{kind}", "label": label}
        if kind == "input":
            attrs.update(shape="box", style="filled", fillcolor="#fde9c8", color="#9a6a1f")
        elif kind == "llm":
            status = n.get("status", "?")
            attrs.update(shape="box", style="rounded,filled,bold", penwidth="2",
                         fillcolor=STATUS_COLOUR.get(status, "#dbe9fb"),
                         label=f"{label}\nLLM · {status}")
            attrs["class"] += f" status-{status}"
        elif kind == "validator":
            attrs.update(shape="hexagon", style="filled", fillcolor="#eeeeee", color="#555555")
        elif kind == "missing":
            attrs.update(shape="box", style="rounded,dotted", label=f"{label}\n(not stored)")
        else:
            attrs.update(shape="box", style="rounded,filled", fillcolor="#dbe9fb",
                         color="#555577")
        if n.get("superseded"):
            attrs.update(style="rounded,dashed", color="#999999", fontcolor="#777777",
                         fillcolor="#f4f4f4", label=f"{label}\n(superseded)")
            attrs["class"] += " superseded"
        lines.append(f"  {_q(k)} [" + ", ".join(f"{a}={_q(str(v))}" for a, v in attrs.items())
                     + "];")
    for a, b in g["edges"]:
        lines.append(f"  {_q(a)} -> {_q(b)} [id={_q(f'dep:{a}:{b}')}, class=\"dep\"];")
    for v in g["verdicts"]:
        kind = "NACK" if v["NACK"] else "ACK" if v["ACK"] else "UNKNOWN"
        lab = " ".join(f"{k} {v[k]}" for k in ("ACK", "NACK", "UNKNOWN") if v[k])
        vid = f"verdict:{v['node']}:{v['validator']}"
        lines.append(f"  {_q(v['node'])} -> {_q(v['validator'])} [id={_q(vid)}, "
                     f"class=\"verdict {kind}\", style=dashed, penwidth=1.5, "
                     f"color={_q(VERDICT_COLOUR[kind])}, fontcolor={_q(VERDICT_COLOUR[kind])}, "
                     f"label={_q(lab)}, fontsize=9];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def have_dot() -> bool:
    import shutil
    return shutil.which("dot") is not None


def svg(g: dict) -> str:
    """The graph laid out by Graphviz's ``dot`` (layered, edges routed around the boxes), as an
    SVG element: node and edge groups keep their ``id`` and ``class`` (see ``dot``); the
    ``<title>`` Graphviz gives each (the hex id) is left out. GraphvizMissing if ``dot`` is not
    installed."""
    import re
    import shutil
    import subprocess

    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing(DOT_MISSING)
    p = subprocess.run([exe, "-Tsvg"], input=dot(g).encode(), capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"Graphviz's dot failed on the trace ({p.returncode}): "
                           f"{p.stderr.decode(errors='replace')[:500]}")
    text = p.stdout.decode("utf-8")
    text = text[text.index("<svg"):]
    text = re.sub(r"<title>[^<]*</title>\n?", "", text)
    return text.replace("<svg ", '<svg id="graph" ', 1)


# --- what the page shows about each node -------------------------------------------------------


def _text(v: Any, limit: int = 4000) -> str:
    """A value as the page shows it: a string as it is, anything else pretty-printed."""
    import pprint
    s = v if isinstance(v, str) else pprint.pformat(v, width=88, sort_dicts=False)
    return s if len(s) <= limit else s[:limit] + f"… ({len(s) - limit} more characters)"


def _value(blob: Any) -> str:
    from incr.keys import decode
    try:
        return _text(decode(bytes(blob)))
    except Exception:
        return "(a value this process cannot decode: a type registered by the program)"


def _verdict(vid: str | None, v: Any) -> dict:
    d = {"validator": (vid or "").rsplit(".", 1)[-1], "kind": v.kind, "case": v.case}
    if v.kind == "NACK":
        d["counterexample"] = _text(v.counterexample, 2000)
        d["message"] = v.message
    elif v.kind == "UNKNOWN":
        d["reason"] = v.reason
    return d


def _diff(a: Any, b: Any) -> str:
    import difflib
    return "\n".join(difflib.unified_diff(_text(a).splitlines(), _text(b).splitlines(),
                                          "previous", "this", lineterm="", n=2))


def details(store, g: dict) -> dict:
    """Per node id, what the page shows when it is clicked (JSON): its value, why it last ran
    (from its stored traces: what differs between the latest and the one before), what it
    reads and what reads it; for an LLM node its attempts (candidate, diff with the one
    before, verdicts, feedback), the verdicts on its current candidate and the stop reason;
    for a validator the nodes it judged."""
    from incr.llmnodes import _unpack_node

    nodes = g["nodes"]
    usage = store.usage()
    names, run_prog, _ = store.programs_usage()
    recs: dict[str, list[dict]] = {}
    last_use: dict[str, int] = {}
    for key, rec, _size in store.iter_records():
        if rec is None:
            continue
        k = "c" + key[:_ikey_len(key)].hex()
        if k in nodes:
            recs.setdefault(k, []).append(rec)
            last_use[k] = max(last_use.get(k, 0), usage.get(key, (0, 0))[1])

    def prog(run: int) -> str:
        p = names.get(run_prog.get(run, -1))
        if p is None:
            return "a program not recorded"
        try:
            return " ".join(json.loads(p))
        except ValueError:
            return p

    def dep_label(kind: str, ref: Any) -> str:
        if kind == "i":
            return f"input {ref}"
        k = "c" + bytes(ref[2]).hex()
        return f"cell {nodes[k]['label'] if k in nodes else _name(ref[0])}"

    reads: dict[str, list[str]] = {}
    read_by: dict[str, list[str]] = {}
    for a, b in g["edges"]:
        reads.setdefault(b, []).append(nodes[a]["label"])
        read_by.setdefault(a, []).append(nodes[b]["label"])
    out: dict[str, dict] = {}
    for k, n in nodes.items():
        d = {"id": k, "kind": n["kind"], "label": n["label"],
             "reads": sorted(reads.get(k, [])), "read_by": sorted(read_by.get(k, []))}
        if n.get("cell"):
            d["function"] = n["cell"]
        if n.get("superseded"):
            by = nodes.get(n.get("superseded_by", ""), {})
            d["superseded"] = (f"an older version of this function; the newer one "
                               f"({by.get('cell', '?')}) ran since")
        rs = sorted(recs.get(k, []), key=lambda r: r["run"])
        if rs:
            cur = rs[-1]
            d["value"] = _value(cur["val"])
            d["last_run"] = cur["run"]
            d["program"] = prog(cur["run"])
            d["traces"] = len(rs)
            d["why"] = _why(k, n, rs, nodes, last_use.get(k, 0), dep_label, prog)
        elif n["kind"] == "input":
            d["value"] = ("(the store keeps an input's value hash, not its value: the program "
                          "sets it)")
        elif n["kind"] == "missing":
            d["why"] = ["A dependency whose record the store no longer holds (gc dropped it, "
                        "or its value could not be stored)."]
        out[k] = d
    for v in g["verdicts"]:
        out[v["node"]].setdefault("verdict_counts", []).append(
            {"validator": nodes[v["validator"]]["label"],
             **{x: v[x] for x in ("ACK", "NACK", "UNKNOWN")}})
        out[v["validator"]].setdefault("judged", []).append(
            {"node": nodes[v["node"]]["label"], **{x: v[x] for x in ("ACK", "NACK", "UNKNOWN")}})
    for ik, data in store.iter_nodes():
        k = "c" + bytes(ik).hex()
        if k not in out:
            continue
        try:
            st = _unpack_node(data, nodes[k]["label"])
        except Exception as e:
            out[k]["llm"] = {"damaged": f"its saved state is damaged ({e})"}
            continue
        out[k]["llm"] = _llm_details(st)
        if st.has_candidate and st.status == "stable":
            out[k]["value"] = _text(st.candidate)
        elif st.has_candidate:
            out[k].pop("value", None)
            out[k]["candidate"] = _text(st.candidate)
        if "why" not in out[k]:
            out[k]["why"] = [f"No value of it is stored: its last run ended {st.status}"
                             + (f" ({st.failed.reason})" if st.failed is not None else "")
                             + "; see the stop reason and attempts below."]
    return out


def _why(k, n, rs, nodes, last_use, dep_label, prog) -> list[str]:
    """Why the instance last ran, as far as its stored traces tell: the store keeps one trace
    per distinct set of values it read, each with the run that wrote it (not the order of the
    traces within a run)."""
    def deps(traces):
        out: dict[tuple, set] = {}
        for r in traces:
            for kind, ref, h in r["deps"]:
                key = (kind, ref if kind == "i" else bytes(ref[2]).hex())
                out.setdefault(key, set()).add(bytes(h))
        return out

    def lab(key):
        kind, ref = key
        return f"input {ref}" if kind == "i" else \
            f"cell {nodes.get('c' + ref, {}).get('label', '(not stored)')}"

    last = rs[-1]["run"]
    same = [r for r in rs if r["run"] == last]
    older = [r for r in rs if r["run"] != last]
    lines = [f"Last ran in run {last} ({prog(last)})."]
    if len(same) > 1:
        d = deps(same)
        varied = [lab(x) for x, hs in d.items() if len(hs) > 1 or
                  any(x not in deps([r]) for r in same)]
        lines.append(f"It ran {len(same)} times in that run, once per distinct set of values "
                     f"it read" + (f"; they differ in: {', '.join(varied)}." if varied else "."))
    if not older:
        lines.append("No trace of an earlier run is stored: computed for the first time then "
                     "(or gc dropped the earlier ones).")
    else:
        prun = older[-1]["run"]
        pd, cd = deps([r for r in older if r["run"] == prun]), deps(same)
        changed = [lab(x) for x in cd if x in pd and cd[x] != pd[x]]
        new = [lab(x) for x in cd if x not in pd]
        gone = [lab(x) for x in pd if x not in cd]
        if changed:
            lines.append(f"Compared with its trace of run {prun}, what it read changed: "
                         f"{', '.join(changed)}.")
        if new:
            lines.append(f"It read what it had not read in run {prun}: {', '.join(new)}.")
        if gone:
            lines.append(f"It no longer read: {', '.join(gone)}.")
        if not (changed or new or gone):
            lines.append(f"It read the same values as in run {prun} (its code or the "
                         f"store's copy may have changed).")
    if last_use > last:
        lines.append(f"Taken from the store without running since; last used in run "
                     f"{last_use}.")
    if n.get("superseded"):
        lines.append("Its function has changed since (a body edit or a new version): the "
                     "newer version's instance is the current one.")
    return lines


def _llm_details(st) -> dict:
    """An LLM node's attempts, current verdicts and stop reason, from its saved state."""
    attempts = []
    prev = None
    for a in st.attempts:
        cand = st.values.get(a.revision)
        att = {"revision": a.revision,
               "candidate": _text(cand) if a.revision in st.values else "(not kept)",
               "verdicts": [_verdict(vid, v) for vid, v in a.verdicts],
               "feedback": [_verdict(None, v) for v in a.feedback],
               "tokens": a.tokens, "cost": a.cost, "note": a.note}
        if prev is not None and a.revision in st.values and prev in st.values \
                and prev != a.revision:
            att["diff"] = _diff(st.values[prev], cand)
        if a.revision in st.values:
            prev = a.revision
        attempts.append(att)
    current = []
    for (vid, _vv, _case, rev), (vs, _d) in sorted(st.ledger.items(), key=lambda t: t[0][:3]):
        if rev == st.revision:
            current += [_verdict(vid, v) for v in vs]
    if st.failed is not None:
        stop = f"failed: {st.failed.reason}"
        if st.failed.report:
            stop += f"\n{st.failed.report}"
    elif st.status == "stable":
        stop = (f"accepted: candidate revision {st.revision} passed its validators "
                f"({sum(v['kind'] == 'ACK' for v in current)} ACK, no NACK, no UNKNOWN)")
    elif st.status == "invalid":
        stop = "invalid: its candidate was rejected; it generates again when demanded"
    else:
        stop = f"{st.status}: not decided yet (the program had not finished judging it)"
    return {"status": st.status, "revision": st.revision, "stop": stop,
            "attempts": attempts, "current_verdicts": current,
            "regressions": [_verdict(None, v) for v in st.regressions],
            "spent": {"attempts": st.spent_attempts, "tokens": st.spent_tokens,
                      "cost": st.spent_cost}}


def timeline(store, limit: int = 100) -> list[dict]:
    """Per run of the store, newest first (the latest ``limit``): its program, and the
    instances it computed (wrote a trace of) and the ones whose last use it was (taken from the
    store, or computed)."""
    usage = store.usage()
    names, run_prog, _ = store.programs_usage()
    runs: dict[int, dict] = {}
    for key, rec, _size in store.iter_records():
        if rec is None:
            continue
        r = runs.setdefault(rec["run"], {"computed": set(), "used": set()})
        r["computed"].add(rec["label"])
        last = usage.get(key, (0, 0))[1]
        if last > rec["run"]:
            runs.setdefault(last, {"computed": set(), "used": set()})["used"].add(rec["label"])
    out = []
    for run in range(store.run, max(0, store.run - limit), -1):
        r = runs.get(run, {"computed": set(), "used": set()})
        p = names.get(run_prog.get(run, -1))
        try:
            p = " ".join(json.loads(p)) if p is not None else None
        except ValueError:
            pass
        out.append({"run": run, "program": p, "computed": sorted(r["computed"]),
                    "taken": sorted(r["used"] - r["computed"])})
    return out


MAX_LAYOUT = 1500
"""The most nodes the page lays out with Graphviz (``incr ui/graph --max-layout N``): dot's
time grows faster than the graph (on a shared 2-core machine: 1,000 nodes 4 s, 3,000 nodes
130 s, 10,000 nodes not done after 2 minutes); above it the page lists the nodes."""


def snapshot(store, *, all_versions: bool = False, layout: bool = True,
             max_layout: int | None = MAX_LAYOUT) -> dict:
    """Everything the page shows, as JSON: the graph, its SVG drawing (None and a message in
    ``layout_error`` when Graphviz is missing, or when the graph has more than ``max_layout``
    nodes), the details per node, the run timeline."""
    g = load(store, all_versions=all_versions)
    snap = {"graph": g, "details": details(store, g), "timeline": timeline(store),
            "runs": store.run, "svg": None, "layout_error": None,
            "superseded": sum(1 for n in load(store, all_versions=True)["nodes"].values()
                              if n.get("superseded")) if not all_versions else
            sum(1 for n in g["nodes"].values() if n.get("superseded"))}
    counts = {k: sum(1 for n in g["nodes"].values() if n["kind"] == k)
              for k in ("input", "cell", "llm", "validator", "missing")}
    summary = (f"{counts['cell']} instances, {counts['llm']} LLM nodes, {counts['input']} "
               f"inputs, {len(g['edges'])} dependencies")
    if counts["validator"]:
        summary += f", {counts['validator']} validators ({len(g['verdicts'])} verdict edges)"
    if counts["missing"]:
        summary += f", {counts['missing']} dependencies no longer stored"
    snap["summary"] = summary + f"; {store.run} runs"
    if layout and max_layout is not None and len(g["nodes"]) > max_layout:
        snap["layout_error"] = (
            f"{len(g['nodes'])} nodes are more than Graphviz lays out in reasonable time here "
            f"(at most {max_layout}; `--max-layout N` changes it; `incr graph STORE --format "
            f"svg -o trace.svg` draws it anyway)")
    elif layout:
        try:
            snap["svg"] = svg(g)
        except GraphvizMissing as e:
            snap["layout_error"] = str(e)
    return snap


# --- the page ----------------------------------------------------------------------------------


def page(title: str, snap: dict | None = None, alt: dict | None = None) -> str:
    """The page (incr/ui_page.html: its own style and script, nothing from elsewhere). With
    ``snap`` it is static (``incr graph --format html``: the data embedded, ``alt`` the other
    view, with or without superseded instances); without, it asks the server of ``incr ui``
    for its data and refreshes when the store changes."""
    from importlib import resources
    tpl = resources.files("incr").joinpath("ui_page.html").read_text(encoding="utf-8")
    data = "null" if snap is None else json.dumps(
        {"current": snap, "alt": alt}).replace("</", "<\\/")
    return (tpl.replace("{{TITLE}}", _html.escape(title))
               .replace("{{DATA}}", data))
