#!/usr/bin/env python3
"""Plot a bench/run result: tps and pooler CPU per transaction against clients, one line per
target, one row of two panels per workload. Writes a self-contained SVG (stdlib only).

    bench/plot.py bench/results/latest.md -o docs/images/performance.svg
    bench/plot.py bench/results/20261126T122703Z            # a run folder: results.csv, else results.md

bench/run calls `write` itself: plot.svg in each run's folder.
"""

import argparse
import csv
import math
import os
import re
import sys
from xml.sax.saxutils import escape

# Target names as bench/run's Markdown tables shorten them.
LONG = {"direct": "direct", "bouncer": "pgbouncer", "bouncer125": "pgbouncer125", "doorman": "pgdoorman",
        "carpool": "pgcarpool", "carpool-base": "pgcarpool-base"}
COLOURS = {"direct": "#7f7f7f", "pgbouncer": "#9ecae1", "pgbouncer125": "#1f77b4", "pgdoorman": "#ff7f0e",
           "pgcarpool": "#2ca02c", "pgcarpool-base": "#98df8a"}
OTHER_COLOURS = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
# (key in a row, panel title)
METRICS = [("tps", "transactions per second"), ("cpu_us_per_txn", "pooler CPU µs per transaction")]
TPS_TITLE, CPU_TITLE = "Throughput (tps)", "Pooler CPU per transaction"

PANEL_W, PANEL_H = 330, 190
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 58, 24, 34, 34
ROW_H = PANEL_H + MARGIN_T + MARGIN_B
COL_W = PANEL_W + MARGIN_L + MARGIN_R
HEADER_H = 56


def number(text):
    """A table cell as a float; None for "–", "ERR", "n/a" and anything else not a number."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_md(path):
    """Rows {workload, clients, target, tps, cpu_us_per_txn} from a results.md (or latest.md)."""
    rows = {}
    metric = None
    header = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("## "):
                title = line[3:]
                metric = "tps" if title.startswith(TPS_TITLE) else \
                    "cpu_us_per_txn" if title.startswith(CPU_TITLE) else None
                header = None
                continue
            if metric is None or not line.startswith("|") or line.startswith("|---"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
                continue
            workload, clients = cells[0], int(cells[1])
            for name, text in zip(header[2:], cells[2:]):
                if "/" in name:  # a ratio column
                    continue
                target = LONG.get(name, name)
                row = rows.setdefault((workload, clients, target),
                                      {"workload": workload, "clients": clients, "target": target})
                row[metric] = number(text)
    return list(rows.values())


def read_csv(path):
    """The same rows from a run's results.csv (medians); rows that did not succeed have no values."""
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r.get("workload") == "idle" or not r.get("clients"):
                continue
            ok = r.get("status", "").startswith("ok")
            row = {"workload": r["workload"], "clients": int(r["clients"]), "target": r["target"]}
            for key, _ in METRICS:
                row[key] = number(r.get(key) or "") if ok else None
            out.append(row)
    return out


def load(path):
    """Rows from a results file or a run folder (results.csv, else results.md, else README.md)."""
    if os.path.isdir(path):
        for name in ("results.csv", "results.md", "README.md"):
            if os.path.exists(os.path.join(path, name)):
                return load(os.path.join(path, name))
        raise FileNotFoundError(f"{path}: no results.csv, results.md or README.md")
    return read_csv(path) if path.endswith(".csv") else read_md(path)


def plotted_workloads(rows):
    """The workloads measured at two client counts or more, in the order of the rows."""
    counts = {}
    for r in rows:
        counts.setdefault(r["workload"], set()).add(r["clients"])
    return [w for w, c in counts.items() if len(c) >= 2]


def nice_step(v):
    """A round grid step (1, 2 or 5 times a power of ten) that covers v in at most 5 steps."""
    if v <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(v / 5))
    for m in (1, 2, 5, 10):
        if v <= 5 * m * p:
            return m * p
    return 10 * p


def label(v):
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


class Panel:
    """One chart: x = clients (log scale), y = a metric from 0."""

    def __init__(self, x0, y0, clients, top):
        self.x0, self.y0 = x0, y0
        self.lo, self.hi = math.log10(min(clients)), math.log10(max(clients))
        self.step = nice_step(top)
        self.ticks = max(1, math.ceil(top / self.step))
        self.ymax = self.step * self.ticks

    def x(self, clients):
        span = self.hi - self.lo or 1.0
        return self.x0 + (math.log10(clients) - self.lo) / span * PANEL_W

    def y(self, v):
        return self.y0 + PANEL_H - v / self.ymax * PANEL_H


def colour_of(targets):
    extra = iter(OTHER_COLOURS * 4)
    return {t: COLOURS.get(t) or next(extra) for t in targets}


def panel_svg(out, rows, workload, key, title, x0, y0, colours):
    mine = [r for r in rows if r["workload"] == workload and r.get(key) is not None]
    clients = sorted({r["clients"] for r in rows if r["workload"] == workload})
    p = Panel(x0, y0, clients, max([r[key] for r in mine], default=0) * 1.05)
    out.append(f'<text x="{x0}" y="{y0 - 10}" class="t">{escape(workload)}: {escape(title)}</text>')
    for i in range(p.ticks + 1):
        v = p.step * i
        y = p.y(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" class="g"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" class="yl">{label(v)}</text>')
    for c in clients:
        x = p.x(c)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + PANEL_H}" class="g"/>')
        out.append(f'<text x="{x:.1f}" y="{y0 + PANEL_H + 15}" class="xl">{c}</text>')
    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{y0 + PANEL_H + 29}" class="xl">clients</text>')
    for target, colour in colours.items():
        pts = sorted((r["clients"], r[key]) for r in mine if r["target"] == target)
        if not pts:
            continue
        xy = " ".join(f"{p.x(c):.1f},{p.y(v):.1f}" for c, v in pts)
        out.append(f'<polyline points="{xy}" stroke="{colour}" data-target="{escape(target)}" class="l"/>')
        for c, v in pts:
            out.append(f'<circle cx="{p.x(c):.1f}" cy="{p.y(v):.1f}" r="3" fill="{colour}">'
                       f'<title>{escape(target)}, {c} clients: {v:,.1f}</title></circle>')


def svg(rows, workloads=None, title="pgcarpool benchmark"):
    """The SVG text: a legend, then for each workload a row of two panels (tps, CPU)."""
    workloads = workloads or plotted_workloads(rows)
    targets = []
    for r in rows:
        if r["workload"] in workloads and r["target"] not in targets and \
                any(r.get(k) is not None for k, _ in METRICS):
            targets.append(r["target"])
    colours = colour_of(targets)
    width, height = 2 * COL_W, HEADER_H + len(workloads) * ROW_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" font-family="sans-serif" font-size="11">',
           "<style>.t{font-weight:bold}.yl{text-anchor:end}.xl{text-anchor:middle}"
           ".g{stroke:#ddd;stroke-width:1}.l{fill:none;stroke-width:2}</style>",
           f'<rect width="{width}" height="{height}" fill="#fff"/>',
           f'<text x="{MARGIN_L}" y="20" font-size="14" class="t">{escape(title)}</text>']
    x = MARGIN_L
    for target, colour in colours.items():
        out.append(f'<rect x="{x}" y="32" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="42">{escape(target)}</text>')
        x += 22 + 7 * len(target)
    for i, workload in enumerate(workloads):
        y0 = HEADER_H + i * ROW_H + MARGIN_T
        for j, (key, name) in enumerate(METRICS):
            panel_svg(out, rows, workload, key, name, j * COL_W + MARGIN_L, y0, colours)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write(path, rows, title="pgcarpool benchmark"):
    """Write the plot of `rows` to `path`; False (nothing written) when no workload has two
    client counts."""
    if not plotted_workloads(rows):
        return False
    with open(path, "w", encoding="utf-8") as f:
        f.write(svg(rows, title=title))
    return True


def title_of(path):
    """The heading of a results.md ("pgcarpool benchmark 2026-11-26 12:27:03Z"), if any."""
    md = path if not os.path.isdir(path) else os.path.join(path, "results.md")
    try:
        with open(md, encoding="utf-8") as f:
            m = re.match(r"# (.+)", f.readline())
            return m.group(1) if m else None
    except OSError:
        return None


def main(argv):
    p = argparse.ArgumentParser(prog="bench/plot.py", description=__doc__.splitlines()[0])
    p.add_argument("source", help="results.md, results.csv, or a run folder")
    p.add_argument("-o", "--out", default="plot.svg")
    p.add_argument("--workloads", help="comma list (default: those measured at two client counts or more)")
    args = p.parse_args(argv)
    rows = load(args.source)
    workloads = args.workloads.split(",") if args.workloads else None
    text = svg(rows, workloads, title_of(args.source) or "pgcarpool benchmark")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
