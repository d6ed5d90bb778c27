"""The demo's headline numbers, computed once from the run record, printed with rich and shown
in the HTML report: time per stage, data wait, checkpoint blocking vs torch.save, bytes saved,
what recovery did, what the lifecycle kept and produced."""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from .svg import human_bytes


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def compute_summary(run: dict) -> dict[str, Any]:
    """Plain numbers (JSON-able) from a run record."""
    out: dict[str, Any] = {}
    stages = run.get("stages", [])
    out["stages"] = [[s["name"], s["seconds"]] for s in stages]
    out["total_s"] = run.get("total_s", sum(s["seconds"] for s in stages))
    data = run.get("data", {})
    if data:
        c = data.get("clean", {})
        out["data"] = {"delivered": data["raw"]["rows"], "duplicates_removed": c.get("duplicates"),
                       "missing_dropped": c.get("dropped_missing"), "quarantined": c.get("quarantined_rows"),
                       "clean_rows": c.get("output_rows"), "train_rows": data.get("train", {}).get("rows"),
                       "val_rows": data.get("val", {}).get("rows"), "injected": data.get("dirt", {})}
    train = run.get("train")
    if train:
        steps = train.get("steps", [])
        wait = sum(s["wait_s"] for s in steps[1:])
        busy = sum(s["compute_s"] + s["ckpt_s"] + s.get("eval_s", 0.0) for s in steps[1:])
        loader = train.get("done", {}).get("loader", {})
        cks = train.get("checkpoints", [])
        blocked = [c["blocked_s"] for c in cks if c.get("blocked_s") is not None]
        alone = [c["blocked_s"] for c in cks if c.get("blocked_s") is not None and not c.get("waited")]
        queued = [c["blocked_s"] for c in cks if c.get("blocked_s") is not None and c.get("waited")]
        logical = sum(c["logical_bytes"] for c in cks)
        stored = sum(c["stored_bytes"] for c in cks)
        full = [c for c in cks if c["kind"] == "full"]
        ratio = (sum(c["stored_bytes"] for c in full) / sum(c["logical_bytes"] for c in full)) if full else 1.0
        baseline = train.get("baseline", {})
        final = cks[-1]["metrics"] if cks else {}
        out["train"] = {
            "steps": len(steps), "params": train.get("params"),
            "wait_fraction": wait / (wait + busy) if wait + busy > 0 else 0.0,
            "loader_wait_fraction": loader.get("wait_fraction"), "data_wait_s": wait,
            "cache_hit_rate": loader.get("cache_hit_rate"),
            "checkpoints": len(cks), "full": len(full), "incremental": len(cks) - len(full),
            "blocking_median_s": _median(blocked), "blocking_max_s": max(blocked, default=0.0),
            "blocking_alone_median_s": _median(alone), "saves_waited": len(queued),
            "blocking_waited_median_s": _median(queued),
            "torch_save_s": baseline.get("torch_save_s"), "torch_save_bytes": baseline.get("torch_save_bytes"),
            "state_bytes": cks[-1]["logical_bytes"] if cks else 0,
            "logical_bytes": logical, "stored_bytes": stored,
            "saved_fraction": 1 - stored / logical if logical else 0.0,
            "saved_by_compression": logical * (1 - ratio), "saved_by_incremental": logical * ratio - stored,
            "final_val_loss": final.get("val_loss"), "final_val_acc": final.get("val_acc"),
        }
    crash = run.get("crash")
    if crash:
        out["crash"] = {"killed_at_step": crash["killed_at_step"], "epoch": crash["killed_in_epoch"] + 1,
                        "batch_in_epoch": crash["batch_in_epoch"], "committed_at_kill": crash["committed_at_kill"],
                        "durable_at_kill": crash.get("durable_at_kill"),
                        "resumed_from": crash["resume"]["step"], "resume_s": crash["resume"]["seconds"],
                        "steps_redone": crash["steps_redone"], "identical": crash["compare"]["identical"],
                        "values_compared": crash["compare"]["values_compared"]}
    corr = run.get("corruption")
    if corr:
        out["corruption"] = {"step": corr["step"], "tensor": corr["tensor"], "detected": corr["detected"],
                             "restored_step": corr["restore"]["step"], "reason": corr["restore"]["reason"],
                             "error": corr["restore"]["skipped"][0][1] if corr["restore"]["skipped"] else ""}
    life = run.get("lifecycle")
    if life:
        out["lifecycle"] = life.get("summary", {})
    return out


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


def summary_rows(s: dict) -> list[tuple[str, str, str]]:
    """(section, what, value) rows: the same text in the console and in the report."""
    rows: list[tuple[str, str, str]] = []
    d = s.get("data")
    if d:
        rows.append(("data", "records delivered -> clean",
                     f"{d['delivered']:,} -> {d['clean_rows']:,} ({d['duplicates_removed']:,} duplicates, "
                     f"{d['missing_dropped']:,} missing text/label, {d['quarantined']:,} malformed -> quarantine)"))
        rows.append(("data", "features (train / val rows)", f"{d['train_rows']:,} / {d['val_rows']:,}"))
    t = s.get("train")
    if t:
        io_bound = " (I/O-bound!)" if t["wait_fraction"] > 0.10 else " (compute-bound: the loader keeps up)"
        rows.append(("training", "steps, model parameters", f"{t['steps']:,} steps, {t['params']:,} parameters"))
        rows.append(("training", "data-wait fraction", f"{t['wait_fraction']:.1%} of step time{io_bound}"))
        rows.append(("training", "final validation", f"loss {t['final_val_loss']:.3f}, accuracy {t['final_val_acc']:.1%}"))
        rows.append(("checkpoints", "saved (full + incremental)",
                     f"{t['checkpoints']} ({t['full']} full + {t['incremental']} incremental), state "
                     f"{human_bytes(t['state_bytes'])}"))
        waited = (f"; {t['saves_waited']} saves first waited for the previous one still in flight "
                  f"(median {_s(t['blocking_waited_median_s'])})") if t.get("saves_waited") else ""
        rows.append(("checkpoints", "training blocked per save",
                     f"median {_s(t.get('blocking_alone_median_s', t['blocking_median_s']))} (host copy; hashing, "
                     f"compression and writes run behind){waited}"))
        if t.get("torch_save_s"):
            mine = t.get("blocking_alone_median_s") or t["blocking_median_s"]
            ratio = t["torch_save_s"] / mine if mine else 0.0
            rows.append(("checkpoints", "plain torch.save of the same state",
                         f"{_s(t['torch_save_s'])} to a local file (not durable, not verified): "
                         + (f"the trainstore save blocks training {ratio:.1f}x shorter" if ratio >= 1 else
                            f"the trainstore save blocked {1 / ratio:.1f}x longer here" if ratio else "")))
        rows.append(("checkpoints", "bytes logical -> stored",
                     f"{human_bytes(t['logical_bytes'])} -> {human_bytes(t['stored_bytes'])} "
                     f"({t['saved_fraction']:.0%} saved: {human_bytes(t['saved_by_compression'])} by compression, "
                     f"{human_bytes(t['saved_by_incremental'])} by incremental deltas)"))
    c = s.get("crash")
    if c:
        rows.append(("recovery", "crash", f"SIGKILL at step {c['killed_at_step']} (epoch {c['epoch']}, batch "
                     f"{c['batch_in_epoch']}); newest committed checkpoint then: step {c['committed_at_kill']} (hot tier), "
                     f"step {c['durable_at_kill']} already durable"))
        rows.append(("recovery", "resume", f"from step {c['resumed_from']} in {_s(c['resume_s'])} "
                     f"({c['steps_redone']} steps redone)"))
        rows.append(("recovery", "resumed vs uninterrupted",
                     ("bit-identical" if c["identical"] else "DIFFERENT") + f" ({c['values_compared']} tensors and "
                     "values: model, optimizer, loader position, RNG)"))
    k = s.get("corruption")
    if k:
        rows.append(("recovery", "corrupted checkpoint",
                     f"step {k['step']} ({k['tensor']}): " + ("detected, skipped" if k["detected"] else "NOT DETECTED")
                     + f"; restore() chose step {k['restored_step']}"))
    life = s.get("lifecycle")
    if life:
        for what, value in life.get("rows", []):
            rows.append(("lifecycle", what, value))
    return rows


def print_summary(console: Console, s: dict) -> None:
    stages = Table("stage", "time", title="time per stage", title_justify="left")
    for name, seconds in s.get("stages", []):
        stages.add_row(name, _s(seconds))
    stages.add_row("[bold]total[/bold]", f"[bold]{_s(s.get('total_s'))}[/bold]")
    console.print(stages)
    table = Table("", "what", "result", title="summary", title_justify="left", show_lines=False)
    last = None
    for section, what, value in summary_rows(s):
        table.add_row(section if section != last else "", what, value)
        last = section
    console.print(table)


__all__ = ["compute_summary", "print_summary", "summary_rows"]
