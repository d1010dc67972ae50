"""p99 time to first token against offered load, one line per strategy, written as SVG by hand
(no plotting dependency): ``docs/images/routing-p99.svg``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

COLOURS = {"sdk": "#d62728", "gie": "#1f77b4", "p2c": "#2ca02c", "rr": "#9467bd", "wrr": "#8c564b"}
LABELS = {
    "sdk": "SDK (snapshot, P2C + prefix key)",
    "gie": "Inference Extension scorer",
    "p2c": "P2C, perfect knowledge",
    "rr": "round robin",
    "wrr": "static WRR (before)",
}
Y_MIN, Y_MAX = 10.0, 30_000.0  # ms, log scale; a p99 past the top (requests left unfinished) sits on it
SLO_MS = 2000.0


def _panel(
    title: str, lines: Mapping[str, Sequence[tuple[float, float]]], x0: float, w: float, h: float
) -> list[str]:
    top, left, bottom = 40.0, x0 + 60.0, h - 50.0
    right = x0 + w - 15.0
    rates = sorted({r for pts in lines.values() for r, _ in pts})
    lo, hi = rates[0], rates[-1]

    def x(rate: float) -> float:
        return left + (rate - lo) / max(1e-9, hi - lo) * (right - left)

    def y(ms: float) -> float:
        v = min(max(ms, Y_MIN), Y_MAX) if math.isfinite(ms) else Y_MAX
        return bottom - (math.log10(v) - math.log10(Y_MIN)) / (math.log10(Y_MAX) - math.log10(Y_MIN)) * (
            bottom - top
        )

    out = [
        f'<text x="{(left + right) / 2:.0f}" y="22" text-anchor="middle" font-weight="bold">{title}</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>',
    ]
    for tick in (10, 100, 1000, 10_000):
        out.append(f'<line x1="{left}" y1="{y(tick):.1f}" x2="{right}" y2="{y(tick):.1f}" stroke="#eee"/>')
        label = f"{tick // 1000} s" if tick >= 1000 else f"{tick} ms"
        out.append(
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" font-size="11">{label}</text>'
        )
    out.append(
        f'<line x1="{left}" y1="{y(SLO_MS):.1f}" x2="{right}" y2="{y(SLO_MS):.1f}" stroke="#999" stroke-dasharray="4 3"/>'
    )
    out.append(
        f'<text x="{right - 2}" y="{y(SLO_MS) - 4:.1f}" text-anchor="end" font-size="10" fill="#666">2 s SLO</text>'
    )
    for r in rates:
        out.append(f'<text x="{x(r):.1f}" y="{bottom + 16}" text-anchor="middle" font-size="11">{r:g}</text>')
    out.append(
        f'<text x="{(left + right) / 2:.0f}" y="{bottom + 34}" text-anchor="middle" font-size="12">offered load (requests/s)</text>'
    )
    out.append(
        f'<text x="{x0 + 14}" y="{(top + bottom) / 2:.0f}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 {x0 + 14} {(top + bottom) / 2:.0f})">p99 time to first token</text>'
    )
    for name, pts in lines.items():
        colour = COLOURS.get(name, "#000")
        path = " ".join(f"{x(r):.1f},{y(ms):.1f}" for r, ms in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for r, ms in pts:
            shape = "circle" if math.isfinite(ms) and ms <= Y_MAX else "rect"
            if shape == "circle":
                out.append(f'<circle cx="{x(r):.1f}" cy="{y(ms):.1f}" r="3" fill="{colour}"/>')
            else:  # requests left unfinished: the p99 is past the top
                out.append(
                    f'<rect x="{x(r) - 3:.1f}" y="{y(ms) - 3:.1f}" width="6" height="6" fill="{colour}"/>'
                )
    return out


def svg(panels: Sequence[tuple[str, Mapping[str, Sequence[tuple[float, float]]]]], note: str = "") -> str:
    """One panel per (title, {strategy: [(rate, p99 ms)]}), side by side, with a shared legend."""
    w, h = 430.0, 330.0
    width = w * len(panels)
    names = [n for n in LABELS if any(n in lines for _, lines in panels)]
    legend_h = 20.0 * len(names) + 30.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{h + legend_h:.0f}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width:.0f}" height="{h + legend_h:.0f}" fill="white"/>',
    ]
    for k, (title, lines) in enumerate(panels):
        parts += _panel(title, lines, k * w, w, h)
    for k, name in enumerate(names):
        yy = h + 10 + 20 * k
        parts.append(f'<line x1="70" y1="{yy}" x2="95" y2="{yy}" stroke="{COLOURS[name]}" stroke-width="3"/>')
        parts.append(f'<text x="102" y="{yy + 4}">{LABELS[name]}</text>')
    if note:
        parts.append(f'<text x="70" y="{h + legend_h - 8:.0f}" font-size="10" fill="#666">{note}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
