"""Hand-made inline SVG charts for the report: no dependency, no script, no network.

Each function returns one ``<svg class="plot">`` element as text: stacked bars (data wait vs
compute per step), grouped bars (checkpoint bytes logical vs stored), horizontal stacked bars
(storage by tier) and a layered graph (lineage). Every mark carries a ``<title>`` tooltip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
FONT = 'font-family="system-ui,-apple-system,Segoe UI,Roboto,sans-serif"'


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2f}".rstrip("0").rstrip(".")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _open(plot_id: str, width: int, height: int, label: str) -> list[str]:
    return [f'<svg class="plot" id="{plot_id}" data-plot="{plot_id}" xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(label)}" {FONT} '
            f'font-size="12">']


def _legend(names: Sequence[str], colors: Sequence[str], x: float, y: float) -> list[str]:
    out, cx = [], x
    for name, color in zip(names, colors):
        out.append(f'<rect class="legend" x="{cx:.1f}" y="{y - 10:.1f}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{cx + 16:.1f}" y="{y:.1f}">{escape(name)}</text>')
        cx += 28 + 7 * len(name)
    return out


def _y_axis(left: float, top: float, plot_h: float, plot_w: float, ymax: float, label: str) -> list[str]:
    out = []
    for i in range(5):
        v = ymax * i / 4
        y = top + plot_h - plot_h * i / 4
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{_fmt(v)}</text>')
    out.append(f'<text transform="translate(14,{top + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'fill="#333">{escape(label)}</text>')
    return out


def stacked_bars(plot_id: str, title: str, xs: Sequence[float], series: Sequence[tuple[str, Sequence[float]]],
                 ylabel: str, xlabel: str, width: int = 900, height: int = 320) -> str:
    """One stacked bar per x (e.g. per training step): series stacked bottom-up."""
    left, right, top, bottom = 64, 16, 52, 44
    pw, ph = width - left - right, height - top - bottom
    totals = [sum(s[1][i] for s in series) for i in range(len(xs))]
    ymax = _nice_max(max(totals, default=0.0))
    ordered = sorted(totals)
    if len(ordered) >= 20:  # a few spikes must not flatten every other bar: clip at 3x the 95th percentile
        p95 = ordered[int(0.95 * (len(ordered) - 1))]
        if 0 < 3 * p95 < ymax:
            ymax = _nice_max(3 * p95)
    out = _open(plot_id, width, height, title)
    out.append(f'<text x="{left}" y="18" font-weight="600" font-size="14">{escape(title)}</text>')
    out += _legend([s[0] for s in series], PALETTE, left, 38)
    out += _y_axis(left, top, ph, pw, ymax, ylabel)
    n = max(len(xs), 1)
    bw = pw / n
    for i, x in enumerate(xs):
        y0 = top + ph
        for k, (name, values) in enumerate(series):
            v = values[i]
            if v <= 0 or y0 <= top:
                continue
            h = min(ph * v / ymax, y0 - top)
            y0 -= h
            out.append(f'<rect class="mark" x="{left + i * bw:.2f}" y="{y0:.2f}" width="{max(bw * 0.9, 0.6):.2f}" '
                       f'height="{h:.2f}" fill="{PALETTE[k]}"><title>{escape(xlabel)} {_fmt(x)}: {escape(name)} '
                       f'{_fmt(v)} {escape(ylabel.split(" ")[-1].strip("()"))}</title></rect>')
        if totals[i] > ymax:  # clipped: mark it, the tooltip has the value
            out.append(f'<path class="clip" d="M {left + i * bw:.2f} {top - 2} l {bw * 0.45:.2f} -6 l {bw * 0.45:.2f} 6 z" '
                       f'fill="#555"><title>{escape(xlabel)} {_fmt(x)}: total {_fmt(totals[i])} (clipped)</title></path>')
    for i in range(0, n, max(1, n // 8)):
        out.append(f'<text x="{left + (i + 0.5) * bw:.1f}" y="{top + ph + 16}" text-anchor="middle" '
                   f'fill="#555">{_fmt(xs[i])}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" fill="#333">{escape(xlabel)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def grouped_bars(plot_id: str, title: str, categories: Sequence[str], series: Sequence[tuple[str, Sequence[float]]],
                 ylabel: str, scale: float = 1.0, sublabels: Sequence[str] = (), width: int = 900,
                 height: int = 320, xlabel: str = "checkpoint step (F = full, I = incremental)",
                 fmt: Callable[[float], str] = human_bytes, show_values: bool = False) -> str:
    """Side-by-side bars per category (e.g. logical vs stored bytes per checkpoint); ``fmt``
    formats a value for its tooltip (and, with ``show_values``, above its bar)."""
    left, right, top, bottom = 64, 16, 52, 56
    pw, ph = width - left - right, height - top - bottom
    ymax = _nice_max(max((v for _, vs in series for v in vs), default=0.0) / scale)
    out = _open(plot_id, width, height, title)
    out.append(f'<text x="{left}" y="18" font-weight="600" font-size="14">{escape(title)}</text>')
    out += _legend([s[0] for s in series], PALETTE, left, 38)
    out += _y_axis(left, top, ph, pw, ymax, ylabel)
    n = max(len(categories), 1)
    gw = pw / n
    bw = gw * 0.8 / max(len(series), 1)
    for i, cat in enumerate(categories):
        for k, (name, values) in enumerate(series):
            v = values[i] / scale
            h = ph * v / ymax
            x = left + i * gw + gw * 0.1 + k * bw
            out.append(f'<rect class="mark" x="{x:.2f}" y="{top + ph - h:.2f}" width="{max(bw - 0.5, 0.6):.2f}" '
                       f'height="{h:.2f}" fill="{PALETTE[k]}"><title>{escape(cat)}: {escape(name)} '
                       f'{escape(fmt(values[i]))}</title></rect>')
            if show_values:
                out.append(f'<text x="{x + bw / 2:.2f}" y="{top + ph - h - 3:.2f}" text-anchor="middle" '
                           f'font-size="10" fill="#333">{escape(fmt(values[i]))}</text>')
        every = max(1, n // 16)
        if i % every == 0:
            out.append(f'<text x="{left + (i + 0.5) * gw:.1f}" y="{top + ph + 15}" text-anchor="middle" '
                       f'fill="#555">{escape(cat)}</text>')
            if i < len(sublabels):
                out.append(f'<text x="{left + (i + 0.5) * gw:.1f}" y="{top + ph + 29}" text-anchor="middle" '
                           f'fill="#888" font-size="10">{escape(sublabels[i])}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" fill="#333">{escape(xlabel)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def tier_bars(plot_id: str, title: str, tiers: Sequence[tuple[str, Sequence[tuple[str, int]]]],
              width: int = 900) -> str:
    """One horizontal bar per tier, split by category; bytes on a shared axis."""
    cats = list(dict.fromkeys(c for _, parts in tiers for c, _ in parts))
    color = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(cats)}
    left, right, top = 150, 100, 40
    row_h, gap = 34, 14
    legend_rows = -(-len(cats) // 4)
    height = top + len(tiers) * (row_h + gap) + 30 + 20 * legend_rows
    pw = width - left - right
    total_max = _nice_max(max((sum(b for _, b in parts) for _, parts in tiers), default=0))
    out = _open(plot_id, width, height, title)
    out.append(f'<text x="16" y="18" font-weight="600" font-size="14">{escape(title)}</text>')
    for i, (tier, parts) in enumerate(tiers):
        y = top + i * (row_h + gap)
        total = sum(b for _, b in parts)
        out.append(f'<text x="{left - 8}" y="{y + row_h / 2 + 4:.1f}" text-anchor="end" font-weight="600">'
                   f'{escape(tier)}</text>')
        x = float(left)
        for cat, b in parts:
            w = pw * b / total_max
            if b <= 0:
                continue
            out.append(f'<rect class="mark" x="{x:.2f}" y="{y}" width="{max(w, 0.8):.2f}" height="{row_h}" '
                       f'fill="{color[cat]}"><title>{escape(tier)}: {escape(cat)} {human_bytes(b)}</title></rect>')
            x += w
        out.append(f'<text x="{x + 6:.1f}" y="{y + row_h / 2 + 4:.1f}" fill="#333">'
                   f'{human_bytes(total)}</text>')
    ly = top + len(tiers) * (row_h + gap) + 8
    for i, cat in enumerate(cats):
        lx = 16 + (i % 4) * ((width - 32) / 4)
        yy = ly + (i // 4) * 20 + 12
        out.append(f'<rect class="legend" x="{lx:.1f}" y="{yy - 10}" width="12" height="12" fill="{color[cat]}"/>')
        out.append(f'<text x="{lx + 16:.1f}" y="{yy}">{escape(cat)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def lineage_graph(plot_id: str, title: str, nodes: Sequence[dict], edges: Sequence[tuple[str, str]],
                  width: int = 900) -> str:
    """A left-to-right layered graph. ``nodes``: {id, label, detail, kind}; ``edges``: (from, to)."""
    ids = [n["id"] for n in nodes]
    parents: dict[str, list[str]] = {i: [] for i in ids}
    for a, b in edges:
        if a in parents and b in parents:
            parents[b].append(a)
    layer: dict[str, int] = {}

    def depth(i: str, seen: tuple[str, ...] = ()) -> int:
        if i not in layer:
            layer[i] = 0 if not parents[i] or i in seen else 1 + max(depth(p, (*seen, i)) for p in parents[i])
        return layer[i]

    for i in ids:
        depth(i)
    columns: dict[int, list[str]] = {}
    for i in ids:
        columns.setdefault(layer[i], []).append(i)
    ncol = max(columns) + 1 if columns else 1
    width = max(width, 40 + 150 * ncol)
    nrow = max((len(v) for v in columns.values()), default=1)
    box_w = min(170.0, (width - 40) / ncol - 24)
    by_id = {n["id"]: n for n in nodes}
    # labels wrap (never cut): every box is as tall as the node with the most lines needs
    lines = {i: (_wrap(by_id[i]["label"], box_w), _wrap(by_id[i].get("detail", ""), box_w, 6.0)) for i in ids}
    most = max((len(a) * 16 + len(b) * 14 for a, b in lines.values()), default=30)
    box_h, vgap, top = max(58, most + 20), 22, 40
    height = top + nrow * (box_h + vgap) + 10
    col_w = (width - 40) / ncol
    pos: dict[str, tuple[float, float]] = {}
    for c, members in columns.items():
        offset = (nrow - len(members)) * (box_h + vgap) / 2
        for r, i in enumerate(members):
            pos[i] = (20 + c * col_w + (col_w - box_w) / 2, top + offset + r * (box_h + vgap))
    kinds = {"dataset": "#e8f0fa", "quarantine": "#fdecea", "features": "#e9f5ec", "checkpoint": "#fff4e0",
             "model": "#f1e8f7", "export": "#eeeeee"}
    out = _open(plot_id, width, height, title)
    out.append('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
               'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#777"/></marker></defs>')
    out.append(f'<text x="16" y="18" font-weight="600" font-size="14">{escape(title)}</text>')
    for a, b in edges:
        if a not in pos or b not in pos:
            continue
        (x1, y1), (x2, y2) = pos[a], pos[b]
        sx, sy, ex, ey = x1 + box_w, y1 + box_h / 2, x2, y2 + box_h / 2
        mx = (sx + ex) / 2
        out.append(f'<path class="edge" d="M {sx:.1f} {sy:.1f} C {mx:.1f} {sy:.1f}, {mx:.1f} {ey:.1f}, {ex - 2:.1f} '
                   f'{ey:.1f}" fill="none" stroke="#777" stroke-width="1.4" marker-end="url(#arrow)"/>')
    for i, (x, y) in pos.items():
        n = by_id[i]
        fill = kinds.get(n.get("kind", ""), "#f5f5f5")
        out.append(f'<g class="node"><rect class="mark" x="{x:.1f}" y="{y:.1f}" width="{box_w:.1f}" height="{box_h}" '
                   f'rx="7" fill="{fill}" stroke="#8a8a8a"><title>{escape(n.get("title", n["label"]))}</title></rect>')
        label, detail = lines[i]
        cx, ty = x + box_w / 2, y + 22
        out.append(f'<text x="{cx:.1f}" y="{ty:.1f}" text-anchor="middle" font-weight="600">'
                   + "".join(f'<tspan x="{cx:.1f}" dy="{0 if k == 0 else 16}">{escape(t)}</tspan>'
                             for k, t in enumerate(label)) + "</text>")
        out.append(f'<text x="{cx:.1f}" y="{ty + 16 * len(label) + 2:.1f}" text-anchor="middle" fill="#555" '
                   'font-size="11">' + "".join(f'<tspan x="{cx:.1f}" dy="{0 if k == 0 else 14}">{escape(t)}</tspan>'
                                               for k, t in enumerate(detail)) + "</text></g>")
    out.append("</svg>")
    return "\n".join(out)


def _wrap(text: str, width: float, char_w: float = 7.0) -> list[str]:
    """``text`` in lines that fit ``width``, broken after ``. @ - / · `` or a space where it
    can be, else hard; nothing is dropped (a lineage label is a name a reader looks up)."""
    n = max(4, int(width / char_w))
    out: list[str] = []
    while len(text) > n:
        cut = max((text.rfind(c, 0, n) for c in ".@-/· _"), default=-1)
        cut = cut + 1 if cut > 0 else n
        out.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return [*out, text]


__all__ = ["grouped_bars", "human_bytes", "lineage_graph", "stacked_bars", "tier_bars"]
