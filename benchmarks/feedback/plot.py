"""A dependency-free SVG: success vs mean spend per arm (cost, calls, tokens), with the 95%
bootstrap band over seeds at each cap (internal). Labelled SIMULATED."""

from __future__ import annotations

from html import escape

COLORS = {"single": "#888888", "resample": "#d98c1f", "whole": "#c23b3b", "cache": "#3b6fc2",
          "recheck": "#8e44ad", "incr": "#2a9d55", "incr_reuse": "#136f3a",
          "incr_par": "#7fd19b", "incr_norevert": "#b5a21c", "strong": "#222222"}
TITLES = {"cost": "mean cost (units: one base first call per node)",
          "calls": "mean model calls (per node)", "tokens": "mean tokens (units)",
          "wall": "MEASURED wall time (units; few seeds)"}


def svg(res: dict) -> str:
    units = list(res["equal_spend"])
    pw, ph, left, top = 300, 260, 50, 70
    width = left + len(units) * (pw + 40) + 120
    height = top + ph + 60
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'font-family="sans-serif" font-size="11">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         '<text x="10" y="20" font-size="14" font-weight="bold">Success (accepted and passes '
         'hidden checks) vs spend, per arm; band: 95% bootstrap over seeds</text>',
         f'<text x="10" y="38" fill="#a00">{escape(res["model"])} (config '
         f'{res["config_sha256"][:12]}, commit {escape(res["git_commit"][:12])})</text>']
    for p, unit in enumerate(units):
        e = res["equal_spend"][unit]
        x0 = left + p * (pw + 40)
        xmax = max(pt["spend"] for d in e["arms"].values() for pt in d["curve"]) * 1.05

        def X(v):
            return x0 + pw * min(max(v / xmax, 0), 1)

        def Y(v):
            return top + ph * (1 - min(max(v, 0), 1))

        o.append(f'<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="#f8f8f8" '
                 f'stroke="#ccc"/>')
        o.append(f'<text x="{x0}" y="{top - 8}" font-weight="bold">'
                 f'{escape(TITLES.get(unit, unit))}</text>')
        for t in range(6):
            yv = t / 5
            o.append(f'<line x1="{x0}" y1="{Y(yv):.1f}" x2="{x0 + pw}" y2="{Y(yv):.1f}" '
                     f'stroke="#e4e4e4"/>')
            o.append(f'<text x="{x0 - 4}" y="{Y(yv) + 4:.1f}" text-anchor="end" '
                     f'fill="#555">{yv:.1f}</text>')
            xv = xmax * t / 5
            o.append(f'<text x="{X(xv):.1f}" y="{top + ph + 14}" text-anchor="middle" '
                     f'fill="#555">{xv:.1f}</text>')
        for arm, d in e["arms"].items():
            c = COLORS.get(arm, "#000")
            pts = d["curve"]
            band = [(pt["spend"], pt["success_ci"]) for pt in pts if pt["success_ci"]]
            if band:
                poly = ([f"{X(s):.1f},{Y(ci[1]):.1f}" for s, ci in band]
                        + [f"{X(s):.1f},{Y(ci[0]):.1f}" for s, ci in reversed(band)])
                o.append(f'<polygon points="{" ".join(poly)}" fill="{c}" fill-opacity="0.15" '
                         f'stroke="none"/>')
            line = " ".join(f"{X(pt['spend']):.1f},{Y(pt['success']):.1f}" for pt in pts)
            dash = ' stroke-dasharray="4,3"' if arm == "incr_par" else ""
            o.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
            for pt in pts:
                o.append(f'<circle cx="{X(pt["spend"]):.1f}" cy="{Y(pt["success"]):.1f}" r="2.5" '
                         f'fill="{c}"/>')
    lx = left + len(units) * (pw + 40) - 10
    for i, arm in enumerate(res["equal_spend"][units[0]]["arms"]):
        y = top + 10 + 18 * i
        o.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 20}" y2="{y}" stroke="{COLORS.get(arm, "#000")}" '
                 f'stroke-width="3"/><text x="{lx + 25}" y="{y + 4}">{escape(arm)}</text>')
    o.append(f'<text x="10" y="{height - 10}" fill="#a00">SIMULATED: a seeded simulation of a '
             f'model with pre-registered parameters, not an LLM.</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"
