"""The analysis's report: every measured configuration, the Pareto front of throughput against
p99, the chosen one and why (its bottleneck node), as terminal text and as one self-contained
HTML page whose plots are inline SVG drawn here (no script, no CDN)."""

# ruff: noqa: E501 - SVG and HTML markup reads better unwrapped
from __future__ import annotations

import html
from dataclasses import dataclass

from flowserve.analyze.search import Goal, Point, Trial, bottlenecks, choose, pareto
from flowserve.analyze.space import Candidate


@dataclass(frozen=True, slots=True)
class Report:
    target: str
    goal: Goal
    trials: list[Trial]
    shipped: Candidate

    @property
    def chosen(self) -> Trial | None:
        return choose(self.trials, self.goal)

    def front(self) -> list[tuple[int, Point]]:
        return pareto([(t.index, p) for t in self.trials for p in t.points])

    def reason(self) -> str:
        chosen = self.chosen
        if chosen is None:
            return (
                f"no configuration met p99 <= {self.goal.p99_ms:g} ms"
                + (f" at {self.goal.min_throughput:g} infer/s or more" if self.goal.min_throughput else "")
                + ": relax the target or widen the budget"
            )
        first = self.trials[0]
        best = chosen.best(self.goal)
        assert best is not None
        gain = (
            f"{chosen.score / first.score:.2f}x the shipped"
            if first.score
            else "the shipped one met the target nowhere"
        )
        ranked = bottlenecks(best)
        where = "its bottleneck now is "
        if ranked:
            top = ranked[0]
            where += f"node '{top.name}' ({top.queue_us:.0f} us queued + {top.compute_us:.0f} us computing per call"
            where += f", {top.rows_per_exec:.1f} rows per execution)"
        else:
            where = "no per-node statistics were read"
        return (
            f"trial #{chosen.index} ({chosen.candidate.describe(self.shipped)}): {chosen.score:.0f} infer/s at "
            f"p99 {best.p99_ms:.2f} ms (c={best.concurrency}), {gain}; {where}"
        )


def text(report: Report) -> str:
    goal = report.goal
    lines = [f"flowserve analyze {report.target}: p99 <= {goal.p99_ms:g} ms", ""]
    head = f"{'#':>3} {'score infer/s':>13} {'p99 ms':>8} {'at c':>5}  configuration (change from shipped)"
    lines += [head, "-" * len(head)]
    front = {i for i, _ in report.front()}
    chosen = report.chosen
    for trial in report.trials:
        best = trial.best(goal)
        mark = (
            "*"
            if chosen is not None and trial.index == chosen.index
            else ("p" if trial.index in front else " ")
        )
        if trial.error:
            lines.append(f"{trial.index:>2}{mark} {'failed':>13} {'':>8} {'':>5}  {trial.why}: {trial.error}")
            continue
        p99 = f"{best.p99_ms:8.2f}" if best else f"{'-':>8}"
        at = f"{best.concurrency:>5}" if best else f"{'-':>5}"
        lines.append(
            f"{trial.index:>2}{mark} {trial.score:>13.0f} {p99} {at}  {trial.candidate.describe(report.shipped)}"
        )
    lines += ["", "* chosen, p: on the Pareto front (throughput against p99, every level measured)", ""]
    lines.append(
        "Pareto front: "
        + ", ".join(f"#{i} {p.throughput:.0f}/s @ {p.p99_ms:.2f} ms" for i, p in report.front())
    )
    lines.append("chosen: " + report.reason())
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ HTML / SVG

_W, _H, _PAD = 640, 360, 48


def _ticks(top: float) -> list[float]:
    if top <= 0:
        return [0.0]
    step = 10 ** len(str(int(top))) / 10 if top >= 1 else 0.1
    for factor in (1, 2, 5, 10):
        if top / (step * factor) <= 6:
            step *= factor
            break
    return [i * step for i in range(int(top / step) + 2)]


def scatter_svg(report: Report) -> str:
    """Throughput (x) against p99 (y) for every level of every trial; the front joined by a line,
    the chosen configuration's points filled, the target as a dashed line."""
    points = [(t.index, p) for t in report.trials for p in t.points if p.throughput > 0]
    if not points:
        return "<p>no measurement</p>"
    xmax = max(p.throughput for _, p in points) * 1.05
    # p99 far past the target would flatten the rest: the axis ends at 3x the target, and points
    # above it sit on the top edge
    ymax = min(max(max(p.p99_ms for _, p in points), report.goal.p99_ms), 3 * report.goal.p99_ms) * 1.1
    xs, ys = _ticks(xmax), _ticks(ymax)
    xmax, ymax = max(xs[-1], xmax), max(ys[-1], ymax)

    def x(v: float) -> float:
        return _PAD + (v / xmax) * (_W - 2 * _PAD)

    def y(v: float) -> float:
        return _H - _PAD - (min(v, ymax) / ymax) * (_H - 2 * _PAD)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" font-size="11" font-family="sans-serif">'
    ]
    out.append(
        f'<rect x="{_PAD}" y="{_PAD}" width="{_W - 2 * _PAD}" height="{_H - 2 * _PAD}" fill="none" stroke="#888"/>'
    )
    for t in xs:
        if t <= xmax:
            out.append(f'<text x="{x(t):.1f}" y="{_H - _PAD + 14}" text-anchor="middle">{t:g}</text>')
    for t in ys:
        if t <= ymax:
            out.append(f'<text x="{_PAD - 4}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<text x="{_W / 2}" y="{_H - 10}" text-anchor="middle">throughput (infer/s)</text>')
    out.append(
        f'<text x="12" y="{_H / 2}" transform="rotate(-90 12 {_H / 2})" text-anchor="middle">p99 (ms)</text>'
    )
    ty = y(report.goal.p99_ms)
    out.append(
        f'<line x1="{_PAD}" x2="{_W - _PAD}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#c33" stroke-dasharray="4 3"/>'
    )
    out.append(f'<text x="{_W - _PAD - 2}" y="{ty - 4:.1f}" text-anchor="end" fill="#c33">target p99</text>')
    front = report.front()
    if len(front) > 1:
        path = " ".join(f"{x(p.throughput):.1f},{y(p.p99_ms):.1f}" for _, p in front)
        out.append(f'<polyline points="{path}" fill="none" stroke="#36c" stroke-width="1.5"/>')
    chosen = report.chosen
    for index, p in points:
        mine = chosen is not None and index == chosen.index
        fill = "#36c" if mine else ("#999" if index else "#e90")
        title = html.escape(f"#{index} c={p.concurrency}: {p.throughput:.0f}/s, p99 {p.p99_ms:.2f} ms")
        out.append(
            f'<circle cx="{x(p.throughput):.1f}" cy="{y(p.p99_ms):.1f}" r="{5 if mine else 3.5}" fill="{fill}">'
            f"<title>{title}</title></circle>"
        )
    out.append("</svg>")
    return "\n".join(out)


def breakdown_svg(report: Report) -> str:
    """Per node: queue and compute time per call (stacked bars), shipped against chosen."""
    rows: list[tuple[str, Point]] = []
    shipped = report.trials[0].loaded(report.goal) if report.trials else None
    if shipped is not None and shipped.nodes:
        rows.append((f"#0 shipped (c={shipped.concurrency})", shipped))
    chosen = report.chosen
    best = chosen.best(report.goal) if chosen is not None else None
    if chosen is not None and best is not None and best.nodes and chosen.index != 0:
        rows.append((f"#{chosen.index} chosen (c={best.concurrency})", best))
    if not rows:
        return "<p>no per-node statistics</p>"
    names = [n.name for n in rows[0][1].nodes]
    bar, gap = 14, 6
    height = _PAD + len(names) * (len(rows) * bar + gap) + 30
    top = max(n.total_us for _, p in rows for n in p.nodes) or 1.0
    scale = (_W - 260) / top
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" font-size="11" font-family="sans-serif">'
    ]
    yy = 20
    out.append('<rect x="160" y="4" width="10" height="10" fill="#e90"/><text x="174" y="13">queued</text>')
    out.append(
        '<rect x="230" y="4" width="10" height="10" fill="#36c"/><text x="244" y="13">computing (us per call)</text>'
    )
    for name in names:
        yy += gap
        for label, point in rows:
            stat = next((n for n in point.nodes if n.name == name), None)
            if stat is None:
                continue
            q, c = stat.queue_us * scale, stat.compute_us * scale
            out.append(
                f'<text x="4" y="{yy + 11}">{html.escape(name)} {html.escape(label.split()[0])}</text>'
            )
            out.append(f'<rect x="160" y="{yy}" width="{q:.1f}" height="{bar - 2}" fill="#e90"/>')
            out.append(f'<rect x="{160 + q:.1f}" y="{yy}" width="{c:.1f}" height="{bar - 2}" fill="#36c"/>')
            out.append(
                f'<text x="{164 + q + c:.1f}" y="{yy + 11}">{stat.queue_us:.0f} + {stat.compute_us:.0f}</text>'
            )
            yy += bar
    out.append("</svg>")
    return "\n".join(out)


def html_page(report: Report) -> str:
    rows = []
    chosen = report.chosen
    for trial in report.trials:
        best = trial.best(report.goal)
        levels = ", ".join(
            f"c={p.concurrency}: {p.throughput:.0f}/s p99 {p.p99_ms:.2f}" for p in trial.points
        )
        style = ' style="background:#dde8ff"' if chosen is not None and trial.index == chosen.index else ""
        cells = [
            str(trial.index),
            html.escape(trial.why),
            f"{trial.score:.0f}",
            f"{best.p99_ms:.2f}" if best else "-",
            html.escape(trial.candidate.describe()),
            html.escape(trial.error or levels),
        ]
        rows.append(f"<tr{style}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>\n")
    title = f"flowserve analyze {report.target}"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}}pre{{background:#f4f4f4;padding:1em}}</style>
</head><body>
<h1>{html.escape(title)}</h1>
<p>Target: p99 &le; {report.goal.p99_ms:g} ms{f", at least {report.goal.min_throughput:g} infer/s" if report.goal.min_throughput else ""}.
{len(report.trials)} configurations measured.</p>
<h2>Chosen</h2><p>{html.escape(report.reason())}</p>
<h2>Throughput against p99</h2>
<p>Every load level of every configuration (orange: shipped, blue: chosen); the line joins the Pareto front.</p>
{scatter_svg(report)}
<h2>Where a request's time goes, per node</h2>
{breakdown_svg(report)}
<h2>Every configuration</h2>
<table><tr><th>#</th><th>step</th><th>score (infer/s within target)</th><th>p99 ms</th><th>configuration</th><th>levels</th></tr>
{"".join(rows)}
</table>
<h2>Terminal report</h2><pre>{html.escape(text(report))}</pre>
</body></html>
"""


__all__ = ["Report", "breakdown_svg", "html_page", "scatter_svg", "text"]
