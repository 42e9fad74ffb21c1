"""The ``incr`` command."""

from __future__ import annotations

import argparse
import json
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
            w(f"\n{ran_total} cell runs this time. Run `incr demo` again: a new process will "
              f"take every value from {store} and run nothing.\n")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="incr", description="incremental computation for Python")
    parser.add_argument("--version", action="version", version=f"incr {incr.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_demo = sub.add_parser("demo", help="run the demonstration pipeline")
    p_demo.add_argument("--json", action="store_true", help="print the steps as JSON")
    p_demo.add_argument("--store", default=".incr", metavar="PATH",
                        help="the LMDB store to use (default: ./.incr)")
    p_demo.add_argument("--memory", action="store_true", help="keep everything in memory")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(store=None if args.memory else args.store, as_json=args.json)
    parser.print_help()
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
