"""Fill docs/evaluation.md's result blocks from a results file (internal).

    python -m benchmarks.feedback.page            # rewrite the blocks from results.json
    python -m benchmarks.feedback.page --check    # exit 1 if a block differs (tests run it)

The page marks each block it takes from the run with ``<!-- results:NAME -->`` ...
``<!-- /results -->``; between them goes the section NAME of what ``python -m
benchmarks.feedback`` printed for that run (``__main__.print_all`` on the saved results, so
the page and the output cannot drift apart), in a fenced block, or for ``counts`` one line.
``config`` is the configuration the run used (from the results, values only). Nothing else on
the page is touched.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

from benchmarks.feedback.__main__ import HERE, ROOT, print_all

PAGE = ROOT / "docs" / "evaluation.md"
RESULTS = HERE / "results.json"

# section name -> how its block in print_all's output begins
SECTIONS = {
    "curve-cost": "success vs spend (cost",
    "curve-wall": "success vs MEASURED wall time",
    "equal-cost": "at equal mean spend (cost",
    "equal-calls": "at equal mean spend (calls",
    "equal-tokens": "at equal mean spend (tokens",
    "equal-wall": "at equal mean spend (wall",
    "runs": "run-level",
    "incr-loop": "incr arms: model calls avoided",
    "per-attempt": "per attempt index",
    "escalation": "escalation by loop round",
    "instances": "the instances family per task",
    "family": "success per family",
    "keep-or-revert": "keep-or-revert:",
    "walltime": "measured wall time",
    "flaky": "flaky validators",
    "sweep": "EXPLORATORY",
}
BLOCK = re.compile(r"(<!-- results:([a-z-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def sections(res: dict) -> dict:
    buf = io.StringIO()
    print_all(res, buf.write)
    out = {}
    for chunk in buf.getvalue().split("\n\n"):
        chunk = chunk.strip("\n")
        for name, head in SECTIONS.items():
            if chunk.startswith(head):
                out[name] = chunk
    out["config"] = "\n".join(
        f"[{sec}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in vals.items())
        for sec, vals in res["config"].items()) + (
        "\ndeviations: " + ", ".join(res["deviations"]) if res["deviations"] else "")
    n_arms, n_tasks = len(res["arms"]), len(res["tasks"])
    seeds = res["seeds"][1] - res["seeds"][0] + 1
    out["counts"] = (f"seeds {res['seeds'][0]}–{res['seeds'][1]}, {n_tasks} tasks, {n_arms} arms: "
                     f"{seeds * n_tasks:,} runs per arm, {seeds * n_tasks * n_arms:,} in all; "
                     f"config `{res['config_sha256'][:12]}`, commit `{res['git_commit'][:7]}`"
                     + (" (DIRTY)" if res["git_commit"].endswith("+dirty") else ""))
    return out


def render(page: str, res: dict) -> str:
    got = sections(res)

    def fill(m):
        name = m.group(2)
        if name not in got:
            raise SystemExit(f"{PAGE.name}: block results:{name} has no section in the results "
                             f"(known: {', '.join(sorted(got))})")
        body = got[name] + "\n" if name == "counts" else f"```\n{got[name]}\n```\n"
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, page)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.feedback.page")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--page", default=str(PAGE))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    res = json.loads(Path(a.results).read_text())
    page = Path(a.page).read_text()
    new = render(page, res)
    if a.check:
        if new != page:
            print(f"{a.page}: result blocks differ from {a.results}; run python -m "
                  f"benchmarks.feedback.page", file=sys.stderr)
            return 1
        return 0
    Path(a.page).write_text(new)
    print(f"{a.page}: {len(BLOCK.findall(new))} blocks from {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
