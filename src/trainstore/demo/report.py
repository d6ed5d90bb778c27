"""The HTML report: one self-contained file (inline CSS and SVG, no script from anywhere).

``render_html(run)`` turns a run record (what the demo saved as ``reports/demo-run.json`` in
the store) into the page; ``write_report`` / ``report_from_store`` are what ``trainstore
demo`` and ``trainstore report`` call. A tiny inline script only checks, after layout, that
every plot has a non-empty box, and says so on the page (a test reads it).
"""

from __future__ import annotations

import json
import os
import time
from html import escape

from ..errors import ConfigError, NotFoundError
from ..fileio import write_atomic
from ..store import Store
from .context import RUN_FORMAT, RUN_KEY
from .summary import compute_summary, summary_rows
from .svg import grouped_bars, human_bytes, lineage_graph, stacked_bars, tier_bars

MAX_BARS = 240
PLOTS = ("plot-steps", "plot-checkpoints", "plot-tiers", "plot-lineage")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#222}
main{max-width:980px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px}
.sub{color:#666;margin-bottom:16px}
section.card{background:#fff;border:1px solid #e2e4e8;border-radius:10px;padding:16px;margin:14px 0}
table{border-collapse:collapse;width:100%;font-size:13px} td,th{padding:5px 8px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top} th{background:#fafafa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37;font-weight:600} .bad{color:#c62828;font-weight:600}
p.note{color:#555;font-size:13px;margin:6px 0 0} code{font-size:12px}
#plot-status{font-size:12px;color:#888}
"""

_CHECK = """
(function(){var ids=%s,ok=0;ids.forEach(function(id){var e=document.getElementById(id);
if(!e){console.error('plot missing: '+id);return;}var b=e.getBoundingClientRect(),
n=e.querySelectorAll('.mark').length;if(b.width>0&&b.height>0&&n>0){e.setAttribute('data-rendered','yes');ok++;}
else{console.error('plot did not render: '+id);}});var s=document.getElementById('plot-status');
s.setAttribute('data-rendered',ok+' of '+ids.length);s.setAttribute('data-ok',ok===ids.length?'yes':'no');})();
"""


def _bin_steps(steps: list[dict]) -> tuple[list[float], list[list[float]]]:
    """Per-step ms (wait, compute, checkpoint+eval) averaged into at most MAX_BARS bins."""
    n = len(steps)
    per = max(1, -(-n // MAX_BARS))
    xs: list[float] = []
    cols: list[list[float]] = [[], [], []]
    for start in range(0, n, per):
        group = steps[start:start + per]
        xs.append(group[-1]["step"])
        k = len(group)
        cols[0].append(1000 * sum(s["compute_s"] for s in group) / k)
        cols[1].append(1000 * sum(s["wait_s"] for s in group) / k)
        cols[2].append(1000 * sum(s["ckpt_s"] + s.get("eval_s", 0.0) for s in group) / k)
    return xs, cols


def _plot_steps(run: dict) -> str:
    steps = run.get("train", {}).get("steps", [])
    xs, (compute, wait, ckpt) = _bin_steps(steps)
    per = max(1, -(-len(steps) // MAX_BARS))
    title = "Data wait vs compute per training step" + (f" (mean of {per} steps per bar)" if per > 1 else "")
    return stacked_bars("plot-steps", title, xs, [("compute", compute), ("data wait", wait),
                                                  ("checkpoint blocking + eval", ckpt)],
                        "time per step (ms)", "step")


def _plot_checkpoints(run: dict) -> str:
    cks = run.get("train", {}).get("checkpoints", [])
    cats = [str(c["step"]) for c in cks]
    subs = ["F" if c["kind"] == "full" else "I" for c in cks]
    logical = [float(c["logical_bytes"]) for c in cks]
    stored = [float(c["stored_bytes"]) for c in cks]
    scale = 1 << 20 if max(logical, default=0) >= 1 << 20 else 1 << 10
    unit = "MiB" if scale == 1 << 20 else "KiB"
    return grouped_bars("plot-checkpoints", "Checkpoint size per step: logical vs stored", cats,
                        [("logical (state size)", logical), ("stored (compressed; deltas for incrementals)", stored)],
                        f"size ({unit})", scale=scale, sublabels=subs)


def _plot_tiers(run: dict) -> str:
    tiers = run.get("storage", {}).get("tiers", [])
    return tier_bars("plot-tiers", "Storage by tier", [(t, [(c, int(b)) for c, b in parts]) for t, parts in tiers])


def _plot_lineage(run: dict) -> str:
    lin = run.get("lineage", {"nodes": [], "edges": []})
    return lineage_graph("plot-lineage", "Lineage: raw data to model version", lin["nodes"],
                         [tuple(e) for e in lin["edges"]])


def _table(headers: list[str], rows: list[list[str]], num: set[int] = frozenset(),  # type: ignore[assignment]
           bad: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    """An HTML table; ``num``: right-aligned columns; ``bad``: columns whose cell, when it
    says "bad", is shown in the bad style."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)

    def cell(i: int, c: str) -> str:
        cls = [*(["num"] if i in num else []), *(["bad"] if i in bad and "bad" in c else [])]
        return f'<td class="{" ".join(cls)}">{escape(c)}</td>' if cls else f"<td>{escape(c)}</td>"

    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bad_steps(run: dict) -> set[int]:
    """Steps found bad: by the lifecycle's deep verify, or the demo's deliberate corruption."""
    bad = set(run.get("lifecycle", {}).get("verify", {}).get("bad", []))
    corr = run.get("corruption") or {}
    if corr.get("detected") and corr.get("step") is not None:
        bad.add(corr["step"])
    return bad


def _codecs(run: dict) -> str:
    """The codecs the stored chunks really use, by share of bytes (from the store's listing)."""
    codecs = run.get("storage", {}).get("codecs") or {}
    total = sum(codecs.values())
    if not total:
        return "the configured codec"
    return ", ".join(f"{c} ({b / total:.0%})" for c, b in sorted(codecs.items(), key=lambda kv: -kv[1]))


def render_html(run: dict) -> str:
    """The report page for a run record."""
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        raise ConfigError(f"not a demo run record (format {str(run.get('format') if isinstance(run, dict) else run)[:40]!r})")
    s = compute_summary(run)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.get("finished", time.time())))
    stage_rows = [[name, f"{sec:.1f} s"] for name, sec in s["stages"]] + [["total", f"{s['total_s']:.1f} s"]]
    summary = [[sec, what, value] for sec, what, value in summary_rows(s)]
    cks = run.get("train", {}).get("checkpoints", [])
    bad = _bad_steps(run)
    ck_rows = [[str(c["step"]), c["kind"], "bad" if c["step"] in bad else "ok", str(c.get("base_step") or ""),
                human_bytes(c["logical_bytes"]),
                human_bytes(c["stored_bytes"]), human_bytes(c["written_bytes"]),
                "-" if c.get("blocked_s") is None else f"{1000 * c['blocked_s']:.1f} ms",
                f"{c['metrics'].get('val_loss', float('nan')):.4f}", f"{c['metrics'].get('val_acc', float('nan')):.1%}"]
               for c in cks]
    retention = run.get("lifecycle", {}).get("retention", {}).get("decisions", [])
    ret_rows = [[str(d["step"]), d["kind"], "bad" if d["step"] in bad else "ok", "keep" if d["keep"] else "delete",
                 "; ".join(d["reasons"])] for d in retention]
    ok = s.get("crash", {}).get("identical") and s.get("corruption", {}).get("detected")
    verdict = ('<span class="ok">resume bit-identical, corruption detected</span>' if ok else
               '<span class="bad">check the recovery section</span>')
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">', "<title>trainstore demo report</title>", f"<style>{_CSS}</style></head><body><main>",
        "<h1>trainstore: end-to-end training pipeline</h1>",
        f'<div class="sub">store <code>{escape(run.get("store", "?"))}</code> · size '
        f'<code>{escape(run.get("config", {}).get("size", "?"))}</code> · finished {escape(when)} · {verdict} · '
        f'<span id="plot-status" hidden></span></div>',
        '<section class="card"><h2>Summary</h2>', _table(["", "what", "result"], summary), "</section>",
        '<section class="card"><h2>Time per stage</h2>', _table(["stage", "time"], stage_rows, {1}), "</section>",
        '<section class="card">', _plot_steps(run),
        '<p class="note">Data wait is the time the training loop spent inside the loader\'s <code>next()</code>; '
        "compute is forward, backward and optimizer step. Above ~10% wait the pipeline is I/O-bound.</p></section>",
        '<section class="card">', _plot_checkpoints(run),
        '<p class="note">Stored bytes are what the checkpoint itself owns in the store after compression '
        f"(chunks stored as {escape(_codecs(run))}); an incremental stores XOR deltas against its full base, "
        "restored bit-exactly. Status: the deep verify of the lifecycle stage (bad: a chunk failed its "
        "hash).</p>",
        _table(["step", "kind", "status", "base", "logical", "stored", "written", "blocked", "val loss", "val acc"],
               ck_rows, {4, 5, 6, 7, 8, 9}, bad={2}), "</section>",
        '<section class="card">', _plot_tiers(run),
        '<p class="note">Hot tier: local directories (the loader\'s shard cache and recent checkpoints); durable '
        "tier: the store; archive: old full checkpoints, when configured.</p></section>",
        '<section class="card">', _plot_lineage(run), "</section>",
    ]
    if ret_rows:
        parts += ['<section class="card"><h2>Retention decisions</h2>',
                  _table(["step", "kind", "status", "decision", "why"], ret_rows, bad={2}), "</section>"]
    parts += [f"<script>{_CHECK % json.dumps(list(PLOTS))}</script>", "</main></body></html>"]
    return "\n".join(parts)


def write_report(run: dict, path: str) -> str:
    """Render ``run`` to ``path`` (atomically: temp file + rename). Returns the absolute path."""
    html = render_html(run)
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, html)
    return path


def save_run(store: Store, run: dict) -> None:
    store.put(RUN_KEY, json.dumps(run, separators=(",", ":"), allow_nan=False, default=str).encode())


def load_run(store: Store) -> dict:
    try:
        data = bytes(memoryview(store.get(RUN_KEY)))
    except NotFoundError:
        raise NotFoundError(f"{store.url} has no demo run record ({RUN_KEY}); run `trainstore demo --store "
                            f"{store.url}` first") from None
    try:
        run = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"{RUN_KEY} in {store.url} is not valid JSON: {exc}") from None
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        raise ConfigError(f"{RUN_KEY} in {store.url} is not a demo run record")
    return run


def report_from_store(store: Store, out: str) -> str:
    """``trainstore report``: the page from the run record saved in ``store``."""
    return write_report(load_run(store), out)


__all__ = ["PLOTS", "load_run", "render_html", "report_from_store", "save_run", "write_report"]
