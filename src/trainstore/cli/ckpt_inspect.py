"""``trainstore ckpt ls|show|verify``: inspect and verify checkpoints from the shell.

Each command opens the store read-mostly (``verify`` writes its ``verify.json`` records) and
prints a table, or JSON with ``--json``. ``verify --watch`` runs the background verifier
(``lifecycle.verifier``) in the foreground as a sidecar: a sweep per ``--period``, reads at
most ``--rate`` bytes/s, one JSON line per sweep with ``--json``, exit 1 on an alert. The
``ckpt`` group (``cli/ckpt.py``) merges these commands with the lifecycle and model ones.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import typer
from rich.markup import escape
from rich.table import Table

from ..checkpoint.format import manifest as mf
from ..errors import ConfigError, NotFoundError
from .common import (
    JsonOpt,
    StoreFlags,
    console,
    emit_json,
    handle_errors,
    metrics_text,
    print_table,
    require_job,
    store_contents,
    when,
    with_store_flags,
)

commands = typer.Typer()


def _manager(url: str, job: str, flags: StoreFlags, *, read_only: bool = False):  # noqa: ANN202 - a CheckpointManager
    """A manager of ``job`` on an existing store; ``NotFoundError`` naming the jobs there if
    ``job`` has no checkpoints (so ``verify`` never passes while verifying nothing)."""
    from ..checkpoint.manager import CheckpointManager

    store = flags.open(url, read_only=read_only)
    require_job(store, job)
    return CheckpointManager(store, job=job)


@commands.command("ls")
@handle_errors
@with_store_flags
def ls(url: str, job: str | None = typer.Option(None, "--job", "-j", help="job name (default: list jobs)"),
       json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """List jobs of a store, or the checkpoints of one job."""
    if job is None:
        store = flags.open(url, read_only=True)
        jobs = mf.list_jobs(store)
        if not jobs:
            raise NotFoundError(f"no checkpoint jobs in {store.url}: {store_contents(store)}")
        if json_out:
            emit_json(jobs)
        else:
            for j in jobs:
                console.print(j)
        return
    with _manager(url, job, flags, read_only=True) as mgr:
        infos = mgr.list(abandoned=True)  # with the steps rollbacks and reruns left behind
    if json_out:
        emit_json([dataclasses.asdict(i) for i in infos])
        return
    table = Table("step", "run", "kind", "base", "created", "logical MB", "stored MB", "status", "metrics",
                  title=f"{url} job {job}")
    for i in infos:
        table.add_row(str(i.step), (i.run or "-") + (" (abandoned)" if i.abandoned else ""), i.kind,
                      "-" if i.base_step is None else str(i.base_step), when(i.created),
                      f"{i.logical_bytes / 1e6:,.1f}", f"{i.stored_bytes / 1e6:,.1f}", i.status,
                      escape(metrics_text(i.metrics)))
    print_table(table, wrap=("metrics",))


@commands.command("show")
@handle_errors
@with_store_flags
def show(url: str, job: str = typer.Option(..., "--job", "-j"), step: int | None = typer.Option(None, "--step", "-s",
         help="default: the newest"), json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Show one checkpoint: metadata, sizes and its tensors."""
    store = flags.open(url, read_only=True)
    steps = require_job(store, job)
    if step is None:
        step = steps[-1]
    m = mf.load_manifest(store, job, step)
    rec = mf.load_verify_record(store, job, step)
    tensors = [{"name": n, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes, "chunks": len(t.chunks),
                "same_as_base": sum(c.same_as_base for c in t.chunks), "deltas": sum(c.is_delta for c in t.chunks)}
               for n, t in m.tensors.items()]
    out = {"job": m.job, "step": m.step, "kind": m.kind, "base_step": m.base_step, "metadata": m.metadata,
           "logical_bytes": m.logical_bytes, "stored_bytes": m.stored_bytes, "written_bytes": m.written_bytes,
           "verify": rec.to_json() if rec else None, "tensors": tensors}
    if json_out:
        emit_json(out)
        return
    console.print(f"[bold]{m.job}[/bold] step {m.step} ({m.kind}{'' if m.base_step is None else f', base {m.base_step}'})")
    console.print(f"logical {m.logical_bytes:,} B, stored {m.stored_bytes:,} B, written {m.written_bytes:,} B")
    console.print(f"metrics {m.metrics}  verify "
                  f"{'never' if rec is None else ('ok' if rec.ok else 'BAD: ' + '; '.join(rec.errors[:2]))}")
    console.print(f"code {m.metadata.get('code_version')}, trainstore {m.metadata.get('trainstore_version')}",
                  soft_wrap=True, highlight=False)
    table = Table("tensor", "dtype", "shape", "bytes", "chunks", "same", "deltas")
    for t in tensors:
        table.add_row(t["name"], t["dtype"], str(t["shape"]), f"{t['bytes']:,}", str(t["chunks"]),
                      str(t["same_as_base"]), str(t["deltas"]))
    print_table(table)


@commands.command("verify")
@handle_errors
@with_store_flags
def verify(url: str, job: str = typer.Option(..., "--job", "-j"), step: int | None = typer.Option(None, "--step", "-s",
           help="default: every checkpoint"), shallow: bool = typer.Option(False, "--shallow",
           help="only check that chunks exist with the right size"),
           watch: bool = typer.Option(False, "--watch", help="keep verifying every --period (a sidecar), "
                                      "reading at most --rate; Ctrl-C stops"),
           period: str = typer.Option("10m", "--period", help="--watch: time between sweeps ('90s', '10m')"),
           rate: str = typer.Option("50MB", "--rate", help="--watch: read budget per second ('50MB', '1GiB')"),
           sweeps: int = typer.Option(0, "--sweeps", help="--watch: stop after this many sweeps (0: never)"),
           json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Re-hash and test-decode every chunk; exit status 1 if any checkpoint is bad."""
    if watch:
        _watch(url, job, period, rate, sweeps, shallow, json_out, flags)
        return
    with _manager(url, job, flags) as mgr:
        records = mgr.verify(step=step, deep=not shallow)
    if not records:  # a cron verify never passes while verifying nothing
        raise NotFoundError(f"nothing to verify in {url} job {job!r}" + ("" if step is None else f" step {step}"))
    if json_out:
        emit_json([r.to_json() for r in records])
    else:
        for r in records:
            mark = "[green]ok[/green]" if r.ok else "[red]BAD[/red]"
            console.print(f"step {r.step}: {mark} ({r.chunks_checked} chunks{', deep' if r.deep else ''})"
                          + ("" if r.ok else "\n  " + "\n  ".join(r.errors[:10])), highlight=False)
    if not all(r.ok for r in records):
        raise typer.Exit(1)


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?)?b?(?:/s)?\s*$", re.IGNORECASE)
_RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}


def parse_rate(value: str) -> float:
    """Bytes per second from ``"50MB"``, ``"1GiB/s"``, ``"2e6"``."""
    try:
        return float(value)
    except ValueError:
        pass
    m = _RATE.match(value)
    if m is None:
        raise ConfigError(f"--rate must be bytes per second like '50MB' or '1GiB', got {value!r}")
    return float(m.group(1)) * _RATE_UNITS[(m.group(2) or "").lower()]


def _watch(url: str, job: str, period: str, rate: str, sweeps: int, shallow: bool, json_out: bool,
           flags: StoreFlags) -> None:
    """``verify --watch``: a ``BackgroundVerifier`` in the foreground; exit 1 on an alert."""
    from ..lifecycle.verifier import BackgroundVerifier, VerifierOptions

    options = VerifierOptions(period=period, rate_bytes_s=parse_rate(rate), deep=not shallow)
    store = flags.open(url)

    def show(event: str, f: dict) -> None:
        if event == "verify" and not json_out:
            mark = "[green]ok[/green]" if f["ok"] else "[red]BAD[/red]"
            fixed = f", {f['repaired']} copies repaired" if f.get("repaired") else ""
            console.print(f"step {f['step']}: {mark}{fixed}", highlight=False)

    def summary(st: dict) -> None:
        if json_out:
            sys.stdout.write(json.dumps({k: st[k] for k in ("sweeps", "verified", "bad", "errors", "repairs",
                                                            "verified_bytes", "alert", "newest")}) + "\n")
            sys.stdout.flush()
        else:
            console.print(f"sweep {st['sweeps']} done in {st['last_sweep_s']:.1f}s: "
                          + ", ".join(f"{s} {status}" for s, status in st["newest"])
                          + (" [red]ALERT[/red]" if st["alert"] else ""), highlight=False)

    verifier = BackgroundVerifier(store, job, options, observers=[show])
    try:
        verifier.run(max_sweeps=sweeps or None, on_sweep=summary)
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
    if verifier.stats()["alert"]:
        raise typer.Exit(1)
