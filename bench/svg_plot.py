#!/usr/bin/env python3
"""A line chart as an SVG image, from JSONL metrics (no plotting library needed).

Usage: svg_plot.py OUT.svg TITLE METRICS.jsonl KEY[:LABEL] [KEY[:LABEL] ...]
Plots each KEY's values against "step" (lines lacking the key are skipped);
the y axis spans 0 to the largest value (rounded up to a tenth).
"""
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def main():
    out, title, path, keys = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    rows = [json.loads(line) for line in open(path) if line.strip()]
    series = []
    for spec in keys:
        key, _, label = spec.partition(":")
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if not pts:
            sys.exit(f"{path}: no values of {key}")
        series.append((label or key, pts))
    xmax = max(x for _, pts in series for x, _ in pts) or 1
    ymax = math.ceil(max(y for _, pts in series for _, y in pts) * 10 + 1e-9) / 10 or 1
    W, H, L, R, T, B = 640, 360, 56, 16, 36, 44
    px = lambda x: L + (W - L - R) * x / xmax
    py = lambda y: H - B - (H - T - B) * y / ymax
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for i in range(6):  # grid and y labels
        y = ymax * i / 5
        s.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
    for i in range(5):  # x labels
        x = xmax * i / 4
        s.append(f'<text x="{px(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:.0f}</text>')
    s.append(f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">step</text>')
    for k, (label, pts) in enumerate(series):
        c = COLORS[k % len(COLORS)]
        path_d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        s.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{path_d}"/>')
        if len(pts) < 40:
            s += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{c}"/>' for x, y in pts]
        s.append(f'<text x="{L + 10}" y="{T + 14 + 16 * k}" fill="{c}">{label}</text>')
    s.append("</svg>")
    open(out, "w").write("\n".join(s) + "\n")


if __name__ == "__main__":
    main()
