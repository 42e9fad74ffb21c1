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

``layout`` places the nodes in layers (what is read left of what reads it), routes every edge
that spans several layers through reserved slots of the layers between, and orders each layer
to reduce crossings: no edge passes through a box it does not connect.
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


# --- DOT ---------------------------------------------------------------------------------------


def _q(s: str) -> str:
    """A DOT double-quoted string. Ids are hex (see ``load``); a label is an escString, where
    a backslash escapes the next character."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def dot(g: dict) -> str:
    nodes = g["nodes"]
    lines = ["digraph incr {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=11];',
             '  edge [color="#777777"];']
    for k, n in sorted(nodes.items()):
        kind = n["kind"]
        attrs = {"label": n["label"]}
        if kind == "input":
            attrs.update(shape="box", style="filled", fillcolor="#fde9c8")
        elif kind == "llm":
            attrs.update(shape="doubleoctagon", style="filled",
                         fillcolor=STATUS_COLOUR.get(n.get("status"), "#dbe9fb"),
                         label=f"{n['label']}\nLLM: {n.get('status', '?')}")
        elif kind == "validator":
            attrs.update(shape="diamond", style="filled", fillcolor="#eeeeee")
        elif kind == "missing":
            attrs.update(shape="ellipse", style="dotted", label=f"{n['label']}\n(not stored)")
        else:
            attrs.update(shape="ellipse", style="filled", fillcolor="#dbe9fb")
        if n.get("superseded"):
            attrs.update(style="dashed", color="#999999", fontcolor="#777777",
                         label=f"{n['label']}\n(superseded)")
        lines.append(f"  {_q(k)} [" + ", ".join(f"{a}={_q(str(v))}" for a, v in attrs.items())
                     + "];")
    for a, b in g["edges"]:
        lines.append(f"  {_q(a)} -> {_q(b)};")
    for v in g["verdicts"]:
        kind = "NACK" if v["NACK"] else "ACK" if v["ACK"] else "UNKNOWN"
        lab = " ".join(f"{k} {v[k]}" for k in ("ACK", "NACK", "UNKNOWN") if v[k])
        lines.append(f"  {_q(v['node'])} -> {_q(v['validator'])} [style=dashed, "
                     f"color={_q(VERDICT_COLOUR[kind])}, label={_q(lab)}, fontsize=9];")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --- layout ------------------------------------------------------------------------------------

CHAR_W = 7.2      # px per character of the 12px label font (a generous average)
BOX_H = 30
SLOT = 44         # vertical room per node or routed edge in a layer
GAP = 90          # between layers
MARGIN = 30
MAX_CHARS = 48    # a longer label is shortened in its box (the full one is its tooltip)


def _box_label(n: dict) -> str:
    lab = n["label"]
    return lab if len(lab) <= MAX_CHARS else lab[:MAX_CHARS - 1] + "…"


def layout(g: dict) -> dict:
    """Positions: ``{"boxes": {id: (x, y, w, h)}, "edges": [{"from", "to", "kind", "points"}],
    "width", "height"}``. Layered: a node sits one layer right of the deepest thing it reads
    (a validator right of the node it judged); an edge across several layers passes through a
    slot of its own in each layer between; each layer is ordered by the mean position of what
    it reads (a few sweeps each way)."""
    nodes = g["nodes"]
    links = [(a, b, "dep", None) for a, b in g["edges"]]
    links += [(v["node"], v["validator"], "verdict", v) for v in g["verdicts"]]
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b, _k, _v in links:
        preds[b].append(a)
    layer: dict[str, int] = {}
    onstack: set[str] = set()
    for start in sorted(nodes):
        stack = [start]
        while stack:
            n = stack[-1]
            if n in layer:
                stack.pop()
                continue
            onstack.add(n)
            pending = [d for d in preds[n] if d not in layer and d not in onstack]
            if pending:
                stack.extend(pending)
                continue
            # (a predecessor still on the stack means a cycle, only in a damaged trace: ignored)
            layer[n] = 1 + max((layer[d] for d in preds[n] if d in layer), default=-1)
            onstack.discard(n)
            stack.pop()
    # chains of dummy nodes for links that span layers (and a back link of a damaged trace)
    order: dict[int, list[str]] = {}
    for n in sorted(nodes, key=lambda n: (nodes[n]["kind"] != "input", nodes[n]["label"], n)):
        order.setdefault(layer[n], []).append(n)
    chains = []
    up: dict[str, list[str]] = {n: [] for n in nodes}
    dummies = 0
    for a, b, kind, v in links:
        la, lb = layer[a], layer[b]
        if lb <= la:           # a damaged, cyclic trace: route it as a plain segment
            chains.append((a, b, kind, v, [a, b]))
            continue
        chain = [a]
        for lay in range(la + 1, lb):
            d = f"\0{dummies}"
            dummies += 1
            order.setdefault(lay, []).append(d)
            layer[d] = lay
            up[d] = [chain[-1]]
            chain.append(d)
        up[b].append(chain[-1])
        chain.append(b)
        chains.append((a, b, kind, v, chain))
    down: dict[str, list[str]] = {}
    for n, ps in up.items():
        for p in ps:
            down.setdefault(p, []).append(n)
    layers = [order.get(i, []) for i in range(max(order, default=-1) + 1)]
    for sweep in range(8):
        rng = range(1, len(layers)) if sweep % 2 == 0 else range(len(layers) - 2, -1, -1)
        nbr = up if sweep % 2 == 0 else down
        for i in rng:
            ref = {n: k for k, n in enumerate(layers[i - 1 if sweep % 2 == 0 else i + 1])}
            cur = {n: k for k, n in enumerate(layers[i])}

            def bary(n):
                ps = [ref[p] for p in nbr.get(n, []) if p in ref]
                return sum(ps) / len(ps) if ps else cur[n]
            layers[i].sort(key=lambda n: (bary(n), cur[n]))
    # coordinates: columns as wide as their widest box; slots stacked, layers centred
    widths = {n: max(60.0, CHAR_W * len(_box_label(nodes[n])) + 20) for n in nodes}
    if any(nodes[n]["kind"] == "llm" for n in nodes):
        for n in nodes:
            if nodes[n]["kind"] == "llm":
                widths[n] = max(widths[n], CHAR_W * (len(nodes[n].get("status", "")) + 5) + 20)
    col_x, x = [], float(MARGIN)
    col_w = []
    for ns in layers:
        w = max((widths[n] for n in ns if n in nodes), default=40.0)
        col_x.append(x)
        col_w.append(w)
        x += w + GAP
    tallest = max((len(ns) for ns in layers), default=1)
    height = MARGIN * 2 + tallest * SLOT
    pos: dict[str, tuple[float, float]] = {}
    for i, ns in enumerate(layers):
        top = MARGIN + (tallest - len(ns)) * SLOT / 2
        for k, n in enumerate(ns):
            pos[n] = (col_x[i], top + k * SLOT + (SLOT - BOX_H) / 2)
    boxes = {n: (pos[n][0], pos[n][1], widths[n], BOX_H) for n in nodes}
    out_edges = []
    for a, b, kind, v, chain in chains:
        pts = []
        for j, n in enumerate(chain):
            x0, y0 = pos[n]
            yc = y0 + BOX_H / 2
            colr = col_x[layer[n]] + col_w[layer[n]]
            if n in nodes:
                right = x0 + widths[n]
                if j == 0:
                    pts += [(right, yc), (colr, yc)]          # out of its box, across its column
                else:
                    pts.append((x0, yc))                       # into the left side of its box
            else:
                pts += [(x0, yc), (colr, yc)]                  # straight through a reserved slot
        out_edges.append({"from": a, "to": b, "kind": kind, "verdict": v, "points": pts})
    return {"boxes": boxes, "edges": out_edges, "width": max(x - GAP + MARGIN, 200.0),
            "height": height, "layer": {n: layer[n] for n in nodes}}


def _path(points: list) -> str:
    """SVG path through ``points``: straight inside a column, an S-curve between columns."""
    (x, y), rest = points[0], points[1:]
    d = [f"M{x:.1f},{y:.1f}"]
    for (x1, y1) in rest:
        if abs(y1 - y) < 0.01 or x1 <= x:
            d.append(f"L{x1:.1f},{y1:.1f}")
        else:
            m = (x + x1) / 2
            d.append(f"C{m:.1f},{y:.1f} {m:.1f},{y1:.1f} {x1:.1f},{y1:.1f}")
        x, y = x1, y1
    return " ".join(d)


def html(g: dict, title: str) -> str:
    """A self-contained page (no script or style from elsewhere): the laid-out graph as SVG;
    clicking a node shows what the store records about it."""
    nodes = g["nodes"]
    lay = layout(g)
    e = _html.escape
    W, H = lay["width"], lay["height"]
    parts = [f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{W:.0f}" '
             f'height="{H:.0f}" viewBox="0 0 {W:.0f} {H:.0f}">',
             '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="8" refY="4" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker>'
             + "".join(f'<marker id="arrow-{k}" markerWidth="8" markerHeight="8" refX="8" '
                       f'refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{c}"/></marker>'
                       for k, c in VERDICT_COLOUR.items()) + "</defs>"]
    for ed in lay["edges"]:
        if ed["kind"] == "dep":
            parts.append(f'<path class="edge" data-kind="dep" data-from="{e(ed["from"])}" '
                         f'data-to="{e(ed["to"])}" d="{_path(ed["points"])}" fill="none" '
                         f'stroke="#999" stroke-width="1.3" marker-end="url(#arrow)"/>')
        else:
            v = ed["verdict"]
            kind = "NACK" if v["NACK"] else "ACK" if v["ACK"] else "UNKNOWN"
            lab = ", ".join(f"{k} {v[k]}" for k in ("ACK", "NACK", "UNKNOWN") if v[k])
            parts.append(f'<path class="edge" data-kind="verdict" data-from="{e(ed["from"])}" '
                         f'data-to="{e(ed["to"])}" d="{_path(ed["points"])}" fill="none" '
                         f'stroke="{VERDICT_COLOUR[kind]}" stroke-width="1.5" '
                         f'stroke-dasharray="5 3" marker-end="url(#arrow-{kind})">'
                         f'<title>{e(lab)}</title></path>')
    for n, (x, y, w, h) in lay["boxes"].items():
        nd = nodes[n]
        kind = nd["kind"]
        fill, stroke, dash, rx = "#dbe9fb", "#557", "", 12
        if kind == "input":
            fill, rx = "#fde9c8", 2
        elif kind == "llm":
            fill, stroke = STATUS_COLOUR.get(nd.get("status"), "#dbe9fb"), "#333"
            rx = 4
        elif kind == "validator":
            fill, rx = "#eeeeee", 15
        elif kind == "missing":
            fill, dash = "#ffffff", ' stroke-dasharray="2 2"'
        if nd.get("superseded"):
            fill, stroke, dash = "#f4f4f4", "#999", ' stroke-dasharray="4 3"'
        extra = ""
        if kind == "llm":
            extra = (f'<text x="{x + w - 6:.1f}" y="{y + 11:.1f}" text-anchor="end" '
                     f'font-size="9" fill="#333">LLM · {e(nd.get("status", "?"))}</text>')
        label_y = y + (22 if kind == "llm" else 19)
        width = ' stroke-width="2"' if kind == "llm" else ""
        parts.append(
            f'<g class="node" data-id="{e(n)}" data-kind="{kind}" tabindex="0">'
            f'<title>{e(nd["label"])}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" rx="{rx}" '
            f'fill="{fill}" stroke="{stroke}"{dash}{width}/>'
            f'<text class="label" x="{x + 10:.1f}" y="{label_y:.1f}" font-size="12">'
            f'{e(_box_label(nd))}</text>{extra}</g>')
    parts.append("</svg>")
    counts = {k: sum(1 for n in nodes.values() if n["kind"] == k)
              for k in ("input", "cell", "llm", "validator", "missing")}
    info = {k: {kk: vv for kk, vv in n.items()} for k, n in nodes.items()}
    for v in g["verdicts"]:
        info[v["node"]].setdefault("verdicts", []).append(
            {"validator": nodes[v["validator"]]["label"],
             **{k: v[k] for k in ("ACK", "NACK", "UNKNOWN")}})
    data = json.dumps(info).replace("</", "<\\/")
    summary = (f"{counts['cell']} instances, {counts['llm']} LLM nodes, {counts['input']} "
               f"inputs, {len(g['edges'])} dependencies")
    if counts["validator"]:
        summary += f", {counts['validator']} validators ({len(g['verdicts'])} verdict edges)"
    if counts["missing"]:
        summary += f", {counts['missing']} dependencies no longer stored"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>incr trace: {e(title)}</title><style>"
        "body{font-family:Helvetica,Arial,sans-serif;margin:16px}"
        "#wrap{display:inline-block;border:1px solid #ddd}"
        "#graph text{font-family:Helvetica,Arial,sans-serif;pointer-events:none}"
        ".node{cursor:pointer}.node.sel rect{stroke:#000;stroke-width:3}"
        "#details{white-space:pre-wrap;background:#f7f7f7;padding:8px;min-height:2em}"
        ".legend span{display:inline-block;padding:2px 8px;margin-right:6px;border:1px solid #557}"
        "</style></head><body>"
        f"<h1>incr trace</h1><p>{e(title)}: {e(summary)}. Arrows point from what was read to "
        "what read it; a dashed coloured arrow is a validator's verdicts on an LLM node's "
        "current candidate (green ACK, red NACK, grey UNKNOWN). Click a node for details.</p>"
        "<p class='legend'><span style='background:#fde9c8'>input</span>"
        "<span style='background:#dbe9fb;border-radius:8px'>cell</span>"
        + "".join(f"<span style='background:{c}'>LLM {s}</span>"
                  for s, c in STATUS_COLOUR.items())
        + "<span style='background:#eee;border-radius:8px'>validator</span></p>"
        f"<div id='wrap'>{''.join(parts)}</div><h2>Details</h2><div id='details'>"
        "(click a node)</div>"
        f"<script>const INFO={data};"
        "document.querySelectorAll('.node').forEach(g=>{const show=()=>{"
        "document.querySelectorAll('.node.sel').forEach(s=>s.classList.remove('sel'));"
        "g.classList.add('sel');const n=INFO[g.dataset.id];"
        "document.getElementById('details').textContent=JSON.stringify(n,null,2);};"
        "g.addEventListener('click',show);"
        "g.addEventListener('keydown',ev=>{if(ev.key==='Enter')show();});});"
        "</script></body></html>\n")
