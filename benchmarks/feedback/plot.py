"""A dependency-free SVG of the main figures: per scenario and arm, success on hidden checks,
model calls and candidates wrongly returned as stable, each with its 95% interval (internal)."""

from __future__ import annotations

from html import escape

COLORS = {"single": "#888888", "resample": "#d98c1f", "whole": "#c23b3b", "cache": "#3b6fc2",
          "incr": "#2a9d55"}
PANELS = (("success", "success on hidden checks (share of tasks)", 1.0),
          ("calls", "model calls per task", None),
          ("wrong_stable", "wrong results returned as stable (share)", 1.0))


def svg(summary: dict, scenarios, arm_names, label: str) -> str:
    pw, ph, left, top = 300, 26 * len(arm_names) + 20, 170, 70
    width = left + len(PANELS) * (pw + 30) + 10
    height = top + len(scenarios) * (ph + 18) + 50
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="10" y="20" font-size="14" font-weight="bold">Local feedback vs. other '
         f'arms at the same budget (mean, 95% bootstrap interval)</text>',
         f'<text x="10" y="38" fill="#a00">{escape(label)}</text>']
    for p, (metric, title, fixed) in enumerate(PANELS):
        x0 = left + p * (pw + 30)
        vmax = fixed or max((summary[k][metric]["hi"] for k in summary), default=1) * 1.1
        o.append(f'<text x="{x0}" y="{top - 12}" font-weight="bold">{escape(title)}</text>')
        for s, sc in enumerate(scenarios):
            y0 = top + s * (ph + 18)
            o.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="#f6f6f6" '
                     f'stroke="#ccc"/>')
            for t in range(5):
                gx = x0 + pw * t / 4
                o.append(f'<line x1="{gx:.1f}" y1="{y0}" x2="{gx:.1f}" y2="{y0 + ph}" '
                         f'stroke="#ddd"/>')
                if s == len(scenarios) - 1:
                    o.append(f'<text x="{gx:.1f}" y="{y0 + ph + 14}" text-anchor="middle" '
                             f'fill="#555">{vmax * t / 4:.2g}</text>')
            if p == 0:
                o.append(f'<text x="10" y="{y0 + 14}" font-weight="bold">{escape(sc)}</text>')
            for i, arm in enumerate(arm_names):
                m = summary.get(f"{sc}/{arm}")
                if m is None:
                    continue
                y = y0 + 16 + i * 26
                if p == 0:
                    o.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end" '
                             f'fill="{COLORS.get(arm, "#000")}">{escape(arm)}</text>')
                v = m[metric]

                def X(val):
                    return x0 + pw * min(max(val / vmax, 0), 1)
                c = COLORS.get(arm, "#000")
                o.append(f'<line x1="{X(v["lo"]):.1f}" y1="{y}" x2="{X(v["hi"]):.1f}" y2="{y}" '
                         f'stroke="{c}" stroke-width="2"/>')
                o.append(f'<circle cx="{X(v["mean"]):.1f}" cy="{y}" r="4" fill="{c}"/>')
                o.append(f'<text x="{X(v["mean"]) + 6:.1f}" y="{y - 5}" font-size="10" '
                         f'fill="#333">{v["mean"]:.2f}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"
