"""The ``incr`` command."""

from __future__ import annotations

import argparse
import json
import shlex
import time
import sys

import incr


def _demo_sheet(rt: incr.Runtime):
    """A small spreadsheet: line items, a subtotal, a discount tier, tax and a total."""
    items = rt.input("items", ("apples", "bread", "coffee"))
    price = {name: rt.input(f"price:{name}", p) for name, p in
             (("apples", 0.50), ("bread", 2.20), ("coffee", 7.90))}
    qty = {name: rt.input(f"qty:{name}", q) for name, q in
           (("apples", 3), ("bread", 1), ("coffee", 2))}
    tax_rate = rt.input("tax_rate", 0.08)

    @incr.cell
    def line(name: str) -> float:
        return round(price[name].get() * qty[name].get(), 2)

    @incr.cell
    def subtotal() -> float:
        return round(sum(line(n) for n in items.get()), 2)

    @incr.cell
    def tier() -> str:
        s = subtotal()
        return "gold" if s >= 50 else "silver" if s >= 20 else "none"

    @incr.cell
    def discount() -> float:
        return {"gold": 0.10, "silver": 0.05, "none": 0.0}[tier()]

    @incr.cell
    def tax() -> float:
        return round(subtotal() * (1 - discount()) * tax_rate.get(), 2)

    @incr.cell
    def total() -> float:
        return round(subtotal() * (1 - discount()) + tax(), 2)

    return {"price": price, "qty": qty, "tax_rate": tax_rate, "total": total}


def _fmt_money(v: float) -> str:
    return f"{v:.2f}"


def demo(store: str | None = ".incr", as_json: bool = False, out=None) -> int:
    """Run the spreadsheet demo on ``store`` (None: in memory) and print what ran."""
    out = out or sys.stdout
    try:
        rt = incr.Runtime(store=store)
    except incr.StoreError as e:
        print(f"incr demo: {e}", file=sys.stderr)
        return 1
    sheet = _demo_sheet(rt)
    total = sheet["total"]
    steps = []

    def record(title, ran, cut_off, loaded, reused):
        steps.append({"step": title, "revision": rt.revision, "ran": ran, "cut_off": cut_off,
                      "loaded": loaded, "reused": reused, "total": observer.value})

    def step(title, change):
        change()
        report = rt.stabilize()
        ran = [lab for lab in report.recomputed if lab not in report.cutoff]
        record(title, ran, list(report.cutoff), list(report.loaded),
               report.reused - len(report.loaded))

    try:
        with rt:
            observer = rt.observe(total)
            rt.stabilize()                     # observing computes nothing: this pass does
            first = sorted(rt._instances(), key=lambda i: i.timestamp)
            record("first computation",
                   [i.label_text for i in first if i.action == "computed"], [],
                   [i.label_text for i in first if i.action == "loaded"], 0)
            step("apples: quantity 3 -> 4", lambda: sheet["qty"]["apples"].set(4))
            step("tax rate 8% -> 10%", lambda: sheet["tax_rate"].set(0.10))
            step("bread: price set to 2.20 again (the same value)",
                 lambda: sheet["price"]["bread"].set(2.20))

            def coffee_change():
                with rt.batch():
                    sheet["price"]["coffee"].set(8.40)
                    sheet["qty"]["coffee"].set(3)

            step("coffee: price 7.90 -> 8.40 and quantity 2 -> 3, in one batch", coffee_change)
            step("apples: quantity 4 -> 5 (the subtotal moves, the discount tier does not)",
                 lambda: sheet["qty"]["apples"].set(5))
            why = rt.explain(total)
            stats = rt.stats()
    finally:
        rt.close()

    ran_total = sum(len(s["ran"]) + len(s["cut_off"]) for s in steps)
    if as_json:
        json.dump({"store": store, "steps": steps, "explain_total": why, "stats": stats,
                   "functions_run": ran_total}, out, indent=2)
        out.write("\n")
        return 0

    w = out.write
    where = f"on the store {store}" if store else "in memory"
    w(f"incr demo: a small spreadsheet, computed incrementally ({where})\n")
    w("After each change: ran = the cells whose function ran; cut off = ran but produced the\n"
      "same value, so nothing that reads it ran; loaded = taken from the store without\n"
      "running; reused = checked and found up to date.\n\n")
    for s in steps:
        w(f"[revision {s['revision']}] {s['step']}\n")
        w(f"    ran:     {', '.join(s['ran']) if s['ran'] else '(nothing)'}\n")
        if s["cut_off"]:
            w(f"    cut off: {', '.join(s['cut_off'])}\n")
        if s["loaded"]:
            w(f"    loaded:  {', '.join(s['loaded'])}\n")
        w(f"    reused:  {s['reused']}\n")
        w(f"    total =  {_fmt_money(s['total'])}\n")
    w(f"\nWhy is total() what it is?\n    {why}\n")
    w(f"\nCounters: computed {stats['computed']}, recomputed {stats['recomputed']} "
      f"(cut off {stats['cutoff']}), reused {stats['reused']}, from the store "
      f"{stats['store_hits']}\n")
    if store:
        if ran_total == 0:
            w(f"\nThis run computed nothing: every value came from {store} (written by an "
              f"earlier run).\n")
        else:
            again = "incr demo --sheet" + ("" if store == ".incr" else
                                           f" --store {shlex.quote(str(store))}")
            w(f"\n{ran_total} cell runs this time. Run `{again}` again: a new process will "
              f"take every value from {store} and run nothing.\n")
    return 0


def _open_store(path: str):
    """The store at ``path`` for reading and gc; never creates one (StoreError if none)."""
    from incr.store import Store

    try:
        return Store(path, count_run=False, create=False)
    except ValueError as e:   # an empty path
        raise incr.StoreError(str(e)) from None


def inspect_cmd(path: str, as_json: bool, out) -> int:
    from incr.store import instances

    from incr.graph import mark_superseded
    from incr.llmnodes import audits, summaries

    store = _open_store(path)
    try:
        rows = mark_superseded(instances(store))
        nodes = summaries(store)
        audit = audits(store)
        runs = store.run
    finally:
        store.close()
    if as_json:
        json.dump({"store": path, "runs": runs, "instances": rows, "llm_nodes": nodes,
                   "validator_changes": audit}, out, indent=2, default=repr)
        out.write("\n")
        return 0
    w = out.write
    total = sum(r["bytes"] for r in rows)
    w(f"{path}: {len(rows)} instances, {sum(r['traces'] for r in rows)} stored traces, "
      f"{total} bytes, {runs} runs\n")
    if not rows:
        return 0
    width = min(60, max(len(r["label"] or "?") for r in rows))
    w(f"{'instance':<{width}}  {'traces':>6}  {'bytes':>9}  {'hits':>6}  {'last run':>8}\n")
    for r in rows:
        lab = (r["label"] or "(damaged)")[:width]
        dmg = f"  ({r['damaged']} damaged)" if r["damaged"] else ""
        old = "  superseded" if r["superseded"] else ""
        w(f"{lab:<{width}}  {r['traces']:>6}  {r['bytes']:>9}  {r['hits']:>6}  "
          f"{r['last_run']:>8}{old}{dmg}\n")
    old = sum(r["superseded"] for r in rows)
    if old:
        w(f"\n{old} superseded: an older version of a function (its code or version changed) "
          f"with the same arguments; a newer one ran since. Kept for a change back; "
          f"`incr gc {shlex.quote(path)}` drops those the latest run did not use.\n")
    if nodes:
        w(f"\nLLM nodes: status, candidate revision, verdicts on that revision, attempts\n")
        for n in nodes:
            if n["damaged"]:
                w(f"  (damaged state {n['key'][:16]}…)\n")
                continue
            v = n["verdicts"]
            why = f" ({n['reason']})" if n["reason"] else ""
            w(f"  {n['label']:<{width - 2}}  {n['status']}{why}, revision {n['revision']}, "
              f"ACK {v['ACK']} NACK {v['NACK']} UNKNOWN {v['UNKNOWN']}, "
              f"{n['attempts']} attempts, {n['regressions']} regression cases\n")
            for a in n.get("history", ()):
                extra = "".join(f"; {k} {a[k]}" for k in ("rationale", "hypothesis")
                                if a.get(k))
                w(f"      revision {a['revision']}: {a['outcome'] or 'open'}{extra}"
                  + ("; patch" if a.get("patch") else "")
                  + (f"; {a['note']}" if a.get("note") else "") + "\n")
    if audit:
        w("\nValidator changes (their earlier verdicts are history, not evidence):\n")
        for r in audit:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["at"]))
            w(f"  {when}  {r['node']}: {r['validator']} {r['old'] or '(none)'} -> "
              f"{r['new'] or '(removed)'}\n")
    return 0


def graph_cmd(path: str, fmt: str, output: str | None, out, all_versions: bool = False,
              max_layout: int | None = None) -> int:
    from incr import graph

    store = _open_store(path)
    try:
        if fmt == "html":
            # the page shows the current instances; its toggle, the superseded ones too
            # (with --all: everything, no toggle)
            limit = graph.MAX_LAYOUT if max_layout is None else max_layout or None
            snap = graph.snapshot(store, all_versions=all_versions, max_layout=limit)
            alt = graph.snapshot(store, all_versions=True, max_layout=limit) \
                if snap["superseded"] and not all_versions else None
            g = snap["graph"]
        else:
            g = graph.load(store, all_versions=all_versions)
    finally:
        store.close()
    if fmt == "json":
        text = json.dumps(g, indent=2) + "\n"
    elif fmt == "html":
        if snap["layout_error"] == graph.DOT_MISSING:   # (over --max-layout: the list)
            raise graph.GraphvizMissing(snap["layout_error"])
        text = graph.page(path, snap, alt)
    elif fmt == "svg":
        text = graph.svg(g)
    else:
        text = graph.dot(g)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
        out.write(f"wrote {output} ({len(g['nodes'])} nodes, {len(g['edges'])} dependencies, "
                  f"{len(g['verdicts'])} verdict edges)\n")
    else:
        out.write(text)
    return 0


def ui_cmd(path: str, port: int, out, open_browser: bool = False,
           max_layout: int | None = None) -> int:
    from incr import graph, ui

    try:
        server = ui.serve(path, port, max_layout=graph.MAX_LAYOUT if max_layout is None
                          else max_layout or None)
    except OSError as e:
        print(f"incr ui: cannot listen on 127.0.0.1:{port}: {e.strerror}; choose another "
              f"port with --port N (0: any free one)", file=sys.stderr)
        return 1
    out.write(f"incr ui: {server.url} shows {path} (refreshes while programs run on it); "
              f"Ctrl-C stops\n")
    out.flush()
    if open_browser:
        import webbrowser
        webbrowser.open(server.url)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _progress_bar(command: str, description: str, asked: bool | None):
    """A bar on stderr for ``command`` when wanted (--progress, INCR_PROGRESS, or stderr is a
    terminal); without rich, a clear line only when --progress asked for it."""
    from incr import progress
    try:
        return progress.bar(description, asked=asked, transient=False)
    except ImportError as e:
        if asked:
            print(f"incr {command}: --progress: {e}; going on without it", file=sys.stderr)
        return progress.bar(description, asked=False)


def gc_cmd(path: str, keep_runs: int, max_bytes: int | None, dry_run: bool, as_json: bool,
           out, compact: bool = False, progress: bool | None = None) -> int:
    from incr.store import collect, compact as compact_store

    store = _open_store(path)
    bar = _progress_bar("gc", "gc: reading entries", progress)

    def told(phase: str, done: int, total: int | None) -> None:
        if phase == "read":
            bar.update(completed=done, total=total, detail=f"{done} entries read")
        else:
            bar.update(completed=done, total=total, description="gc: dropping",
                       detail=f"{done} of {total} dropped")
    try:
        result = collect(store, keep_runs=keep_runs, max_bytes=max_bytes, dry_run=dry_run,
                         progress=told)
    finally:
        bar.close()
        store.close()
    if compact and not dry_run:   # (after close: compacting needs the store to itself)
        before, after = compact_store(path)
        result["compacted"] = {"before": before, "after": after}
    if as_json:
        json.dump(result, out, indent=2)
        out.write("\n")
        return 0
    verb = "would drop" if dry_run else "dropped"
    out.write(f"{path}: {verb} {result['dropped']} of {result['entries']} entries "
              f"({result['bytes_freed']} bytes); kept {result['kept']} reachable from the "
              f"latest {keep_runs} run(s) of each program\n")
    for p in result.get("programs", []):
        name = p["program"] if p["program"] is not None else "(runs with no recorded program)"
        out.write(f"  {name}: runs {', '.join(map(str, p['runs']))}; {p['roots']} entries "
                  f"used\n")
    if "compacted" in result:
        c = result["compacted"]
        out.write(f"{path}: compacted data.mdb from {c['before']} to {c['after']} bytes\n")
    return 0


MAX_LAYOUT_HELP = ("above N nodes the page lists them instead of drawing them (Graphviz takes "
                   "minutes on thousands of nodes; default 1500; 0: always draw)")


def _parser() -> argparse.ArgumentParser:
    """incr's command line: every subcommand and option has a help text."""
    parser = argparse.ArgumentParser(prog="incr", description="incremental computation for Python")
    parser.add_argument("--version", action="version", version=f"incr {incr.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_demo = sub.add_parser("demo", help="run the demonstration pipeline")
    p_demo.add_argument("--json", action="store_true", help="print the steps as JSON")
    p_demo.add_argument("--store", default=".incr", metavar="PATH",
                        help="the LMDB store to use (default: ./.incr)")
    p_demo.add_argument("--memory", action="store_true", help="keep everything in memory")
    p_demo.add_argument("--sheet", action="store_true",
                        help="the spreadsheet demo of the plain engine instead of the SQL story")
    p_demo.add_argument("--model", metavar="openai:NAME",
                        help="use a real OpenAI-compatible chat model instead of the scripted "
                             "stand-in (needs `pip install 'incr[openai]'`)")
    p_demo.add_argument("--base-url", metavar="URL",
                        help="the endpoint for --model (e.g. http://localhost:8080/v1)")
    p_insp = sub.add_parser("inspect", help="list the instances a store holds")
    p_insp.add_argument("store", metavar="STORE", help="the store directory (e.g. .incr)")
    p_insp.add_argument("--json", action="store_true",
                        help="print the instances as JSON instead of a table")
    p_graph = sub.add_parser("graph", help="draw the stored trace (DOT, SVG, HTML or JSON)")
    p_graph.add_argument("store", metavar="STORE", help="the store directory (e.g. .incr)")
    p_graph.add_argument("--format", choices=("dot", "svg", "html", "json"), default="dot",
                         help="Graphviz DOT, SVG laid out by Graphviz, a standalone HTML page "
                              "(the page of `incr ui`, not live), or JSON (default: dot; svg "
                              "and html need Graphviz's dot program)")
    p_graph.add_argument("--json", action="store_true", help="same as --format json")
    p_graph.add_argument("-o", "--output", metavar="FILE", help="write to FILE")
    p_graph.add_argument("--max-layout", type=int, default=None, metavar="N",
                         help=MAX_LAYOUT_HELP + " (--format html)")
    p_graph.add_argument("--all", action="store_true",
                         help="also draw superseded instances (an older version of a function "
                              "with the same arguments), dashed")
    p_ui = sub.add_parser("ui", help="show the stored trace as a live page in a web browser")
    p_ui.add_argument("store", metavar="STORE", help="the store directory (e.g. .incr)")
    p_ui.add_argument("--port", type=int, default=8765, metavar="N",
                      help="serve on 127.0.0.1:N (default 8765; 0: any free port)")
    p_ui.add_argument("--open", action="store_true", help="also open the page in a browser")
    p_ui.add_argument("--max-layout", type=int, default=None, metavar="N", help=MAX_LAYOUT_HELP)
    p_gc = sub.add_parser("gc", help="drop entries the latest runs cannot reach")
    p_gc.add_argument("store", metavar="STORE", help="the store directory (e.g. .incr)")
    p_gc.add_argument("--keep-runs", type=int, default=1, metavar="N",
                      help="entries used by the latest N runs of each program (its "
                           "command line) are roots (default 1)")
    p_gc.add_argument("--max-bytes", type=int, default=None, metavar="B",
                      help="then drop least recently used entries until under B bytes")
    p_gc.add_argument("--dry-run", action="store_true",
                      help="report what would be dropped; change nothing")
    p_gc.add_argument("--compact", action="store_true",
                      help="then shrink data.mdb to what it holds (not with --dry-run; "
                           "refused while another process has the store open)")
    p_gc.add_argument("--json", action="store_true", help="print the result as JSON")
    p_gc.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="a progress bar on stderr (default: when stderr is a terminal, or "
                           "INCR_PROGRESS=1; needs rich: pip install 'incr[progress]')")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    out = sys.stdout
    try:
        if args.command == "demo":
            store = None if args.memory else args.store
            if args.sheet:
                return demo(store=store, as_json=args.json)
            from incr import demo_sql
            return demo_sql.run(store, model_spec=args.model, base_url=args.base_url,
                                as_json=args.json)
        if args.command == "inspect":
            return inspect_cmd(args.store, args.json, out)
        if args.command == "graph":
            return graph_cmd(args.store, "json" if args.json else args.format, args.output, out,
                             all_versions=args.all, max_layout=args.max_layout)
        if args.command == "ui":
            return ui_cmd(args.store, args.port, out, open_browser=args.open,
                          max_layout=args.max_layout)
        if args.command == "gc":
            if args.keep_runs < 1:
                parser.error("--keep-runs must be at least 1")
            return gc_cmd(args.store, args.keep_runs, args.max_bytes, args.dry_run, args.json,
                          out, compact=args.compact, progress=args.progress)
    except incr.StoreError as e:
        print(f"incr {args.command}: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        from incr.graph import GraphvizMissing
        if not isinstance(e, GraphvizMissing):
            raise
        print(f"incr {args.command}: {e}", file=sys.stderr)
        return 1
    except Exception as e:   # an lmdb error the store did not explain: still one line
        import lmdb
        if not isinstance(e, lmdb.Error):
            raise
        from incr.store import _explain
        print(f"incr {args.command}: {_explain(getattr(args, 'store', '?'), e, args.command)}",
              file=sys.stderr)
        return 1
    parser.print_help()
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
