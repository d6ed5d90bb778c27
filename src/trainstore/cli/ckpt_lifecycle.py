"""Lifecycle commands of ``trainstore ckpt``: restore, retain, gc, tier, register, alias, models,
export, stats. Added to the ``ckpt`` app by ``cli/ckpt.py`` (imported from its ``register``).

Every command prints a rich table, or JSON with ``--json``; long operations show a progress
bar on stderr. Bad input (an unknown model or alias, a retention rule set that would delete
every checkpoint, an export of a missing step) is one red line and exit status 2.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..checkpoint import manifest as mf
from ..errors import ConfigError, NotFoundError
from ..store import open_store
from .ckpt import EndpointOpt, HttpOpt, JsonOpt, RegionOpt, ckpt_app
from .common import console, emit_json, err_console, handle_errors, store_options

JobOpt = typer.Option(..., "--job", "-j", help="job name")


def _store(url: str, endpoint: str | None, region: str | None, allow_http: bool | None, create: bool = False):
    return open_store(url, create=create, **store_options(endpoint, region, allow_http))


def _when(t: float | None) -> str:
    return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "-"


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:,.2f}s"


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A transient progress bar on stderr (stdout stays clean for --json)."""
    if not enabled:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        yield progress


# -- restore --------------------------------------------------------------------------------
@ckpt_app.command("restore")
@handle_errors
def restore(url: str, job: str = JobOpt, to: str = typer.Option(..., "--to", help="output FILE.safetensors"),
            step: int | None = typer.Option(None, "--step", "-s", help="default: newest that verifies"),
            best: str | None = typer.Option(None, "--best", help="restore the best checkpoint by this metric"),
            mode: str = typer.Option("min", "--mode", help="min or max (with --best)"),
            dtype: str | None = typer.Option(None, "--dtype", help="cast floats to bf16 or fp16"),
            only: str | None = typer.Option(None, "--only", help="only tensors under this prefix, e.g. model/"),
            json_out: bool = JsonOpt, endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
            allow_http: bool | None = HttpOpt) -> None:
    """Restore a checkpoint (falling back past bad ones) and write its tensors as safetensors."""
    from ..checkpoint.manager import CheckpointManager
    from ..lifecycle.export import state_tensors, write_safetensors
    from ..lifecycle.metrics import CheckpointMetrics

    if not to.endswith(".safetensors"):
        raise ConfigError(f"--to must name a .safetensors file, got {to!r}")
    store = _store(url, endpoint, region, allow_http)
    metrics = CheckpointMetrics(store=store)  # the restore counts in `ckpt stats`
    with CheckpointManager(store, job, observers=[metrics.observe]) as mgr:
        with console.status(f"restoring {job} ...") if not json_out else _progress(False):
            result = mgr.restore_with_info(step, best=best, mode=mode)
    res = write_safetensors(state_tensors(result.state), to, job=job, step=result.step, dtype=dtype, only=only)
    out = {**res.to_json(), "reason": result.reason, "skipped": result.skipped, "seconds": result.seconds}
    if json_out:
        emit_json(out)
        return
    console.print(f"restored step {result.step} ({escape(result.reason)}) in {result.seconds:.2f}s -> "
                  f"{escape(res.path)} ({res.tensors} tensors, {res.bytes:,} B, sha256 {res.sha256[:16]}...)")
    for s, why in result.skipped:
        console.print(f"  [yellow]skipped[/yellow] step {s}: {escape(why)}")


# -- retention ------------------------------------------------------------------------------
@ckpt_app.command("retain")
@handle_errors
def retain(url: str, job: str = JobOpt,
           keep_last: int | None = typer.Option(None, "--keep-last", help="keep the N newest"),
           keep_within: str | None = typer.Option(None, "--keep-within", help="keep all younger than e.g. 7d"),
           keep_full_within: str | None = typer.Option(None, "--keep-full-within", help="keep full ones younger than e.g. 30d"),
           keep_every: int | None = typer.Option(None, "--keep-every", help="keep steps that are multiples of K"),
           keep_best: list[str] = typer.Option([], "--keep-best", help="METRIC[:N[:min|max]] (repeatable)"),
           keep_registered: bool = typer.Option(True, "--keep-registered/--no-keep-registered",
                                                help="keep registered model versions (default: yes)"),
           allow_delete_all: bool = typer.Option(False, "--allow-delete-all", help="allow deleting every checkpoint"),
           dry_run: bool = typer.Option(False, "--dry-run", help="only say what would go and why"),
           json_out: bool = JsonOpt, endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
           allow_http: bool | None = HttpOpt) -> None:
    """Apply retention rules (default: the preset - all of the last week, full ones of the last
    month, registered forever). Deleted checkpoints' chunks are reclaimed by `ckpt gc`."""
    from ..lifecycle import retention as rt

    rules: list[rt.Rule] = []
    if keep_last:
        rules.append(rt.LatestN(keep_last))
    if keep_within:
        rules.append(rt.Within(keep_within))
    if keep_full_within:
        rules.append(rt.FullWithin(keep_full_within))
    if keep_every:
        rules.append(rt.EveryNSteps(keep_every))
    rules += [rt.BestN.parse(b) for b in keep_best]
    if not rules:
        rules = [rt.Within("7d"), rt.FullWithin("30d")]
    if keep_registered:
        rules.append(rt.Registered())
    policy = rt.AnyOf(*rules)
    store = _store(url, endpoint, region, allow_http)
    if not mf.list_steps(store, job):
        raise NotFoundError(f"job {job!r} has no checkpoints in {store.url}")
    plan = rt.apply_retention(store, job, policy, dry_run=dry_run, allow_delete_all=allow_delete_all)
    if json_out:
        emit_json(plan.to_json())
        return
    title = f"{escape(store.url)} job {escape(job)}: {rt.describe(policy)}" + (" [dry run]" if dry_run else "")
    table = Table("step", "kind", "created", "decision", "why", title=title)
    for d in plan.decisions:
        mark = "[green]keep[/green]" if d.keep else ("[yellow]would delete[/yellow]" if dry_run else "[red]deleted[/red]")
        table.add_row(str(d.step), d.kind, _when(d.created), mark, escape("; ".join(d.reasons)))
    console.print(table)
    freed = sum(d.stored_bytes for d in plan.deleted)
    console.print(f"{len(plan.kept)} kept, {len(plan.deleted)} {'would be ' if dry_run else ''}deleted "
                  f"(up to {freed:,} B of chunks for `ckpt gc` to reclaim)")


# -- garbage collection ---------------------------------------------------------------------
@ckpt_app.command("gc")
@handle_errors
def gc(url: str, grace: str = typer.Option("1h", "--grace", help="only delete chunks older than this"),
       dry_run: bool = typer.Option(False, "--dry-run", help="report what would be deleted"),
       ignore_unreadable: bool = typer.Option(False, "--ignore-unreadable",
                                              help="sweep even if a manifest is unreadable"),
       json_out: bool = JsonOpt, endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
       allow_http: bool | None = HttpOpt) -> None:
    """Delete chunks no checkpoint references (safe while training saves: see docs/lifecycle.md)."""
    from ..lifecycle.gc import GcOptions, collect_garbage

    store = _store(url, endpoint, region, allow_http)
    with _progress(not json_out) as progress:
        task = progress.add_task("gc", total=None) if progress else None

        def report(what: str, done: int, total: int) -> None:
            if progress is not None:
                progress.update(task, description=what, completed=done, total=total)

        rep = collect_garbage(store, GcOptions(grace=grace, ignore_unreadable=ignore_unreadable), dry_run=dry_run,
                              progress=report)
    if json_out:
        emit_json(rep.to_json())
        return
    table = Table("", "chunks", "bytes", title=f"gc of {escape(store.url)}" + (" [dry run]" if dry_run else ""))
    table.add_row("stored", f"{rep.chunks:,}", f"{rep.chunk_bytes:,}")
    table.add_row("referenced", f"{rep.referenced:,}", f"{rep.referenced_bytes:,}")
    table.add_row("unreferenced, within grace", f"{rep.too_young:,}", "")
    table.add_row("would delete" if dry_run else "deleted", f"{rep.deleted:,}", f"{rep.bytes_reclaimed:,}")
    console.print(table)
    console.print(f"{rep.manifests} manifests of {rep.jobs} jobs, {rep.leases} live save leases, {rep.seconds:.2f}s")
    if rep.missing:
        console.print(f"[red]{rep.missing} referenced chunks are missing[/red]: run `trainstore ckpt verify`")


# -- tiering --------------------------------------------------------------------------------
@ckpt_app.command("tier")
@handle_errors
def tier(hot: str, job: str = JobOpt, durable: str = typer.Option(..., "--durable", help="durable tier URL"),
         archive: str | None = typer.Option(None, "--archive", help="archive tier URL"),
         sync: bool = typer.Option(False, "--sync", help="copy hot checkpoints the durable tier lacks"),
         evict: bool = typer.Option(False, "--evict", help="evict durable checkpoints past the hot rule"),
         keep_hot: int = typer.Option(2, "--keep-hot", help="hot rule: keep the N newest in hot"),
         archive_after: str | None = typer.Option(None, "--archive-after",
                                                     help="move durable full checkpoints older than this to --archive"),
         dry_run: bool = typer.Option(False, "--dry-run"), json_out: bool = JsonOpt,
         endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
         allow_http: bool | None = HttpOpt) -> None:
    """Status per checkpoint (hot / durable / archived, created -> ready -> durable), and actions."""
    from ..lifecycle.tiering import Tiering, TierPolicy

    opts = store_options(endpoint, region, allow_http)
    tiers = Tiering(hot, open_store(durable, **opts), archive=open_store(archive, **opts) if archive else None,
                    policy=TierPolicy(hot_keep_last=keep_hot, archive_after=archive_after))
    actions: dict[str, list[int]] = {}
    if sync:
        missing = [s for s in mf.list_steps(tiers.hot, job) if not tiers.durable.exists(mf.manifest_key(job, s))]
        actions["synced"] = missing
        if not dry_run:
            with _progress(not json_out) as progress:
                task = progress.add_task("copying to durable", total=len(missing)) if progress else None
                for s in missing:
                    tiers.make_durable(job, s)
                    if progress:
                        progress.advance(task)
    if evict:
        actions["evicted"] = tiers.evict(job, dry_run=dry_run)
    if archive_after is not None:
        actions["archived"] = tiers.archive(job, dry_run=dry_run)
    status = tiers.status(job)
    if json_out:
        emit_json({"actions": actions, "dry_run": dry_run, "checkpoints": [s.to_json() for s in status]})
        return
    for what, steps in actions.items():
        console.print(f"{'would be ' if dry_run else ''}{what}: {steps or 'none'}")
    table = Table("step", "kind", "tiers", "created", "-> restore-ready", "-> durable",
                  title=escape(f"{tiers.store.url} job {job}"))
    for s in status:
        table.add_row(str(s.step), s.kind, s.tiers, _when(s.created), _secs(s.restore_ready_s), _secs(s.durable_s))
    console.print(table)


# -- registry -------------------------------------------------------------------------------
def _version_row(mv: Any, aliases: dict[str, int]) -> list[str]:
    names = ", ".join(a for a, v in sorted(aliases.items()) if v == mv.version)
    return [str(mv.version), names, f"{mv.job}@{mv.step}", mv.kind, mv.checkpoint_id[:12], mv.dataset or "-",
            escape(", ".join(f"{k}={v}" for k, v in list(mv.metrics.items())[:4])), _when(mv.created)]


@ckpt_app.command("register")
@handle_errors
def register_cmd(url: str, job: str = JobOpt, step: int = typer.Option(..., "--step", "-s"),
                 model: str = typer.Option(..., "--model", "-m", help="model name"),
                 alias: list[str] = typer.Option(["latest"], "--alias", "-a", help="aliases to move (repeatable)"),
                 dataset: str | None = typer.Option(None, "--dataset", help="dataset version, e.g. tokens@3"),
                 note: str | None = typer.Option(None, "--note"), json_out: bool = JsonOpt,
                 endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
                 allow_http: bool | None = HttpOpt) -> None:
    """Register a checkpoint as the next version of a model (kept forever by retention)."""
    from ..lifecycle.registry import Registry

    reg = Registry(_store(url, endpoint, region, allow_http))
    mv = reg.register(job, step, model, dataset=dataset, note=note, aliases=tuple(alias))
    if json_out:
        emit_json(mv.to_json())
        return
    console.print(f"registered {job}@{step} as [bold]{mv.ref}[/bold]" + (f" ({', '.join(alias)})" if alias else ""))


@ckpt_app.command("models")
@handle_errors
def models(url: str, model: str | None = typer.Option(None, "--model", "-m", help="show this model's versions"),
           json_out: bool = JsonOpt, endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
           allow_http: bool | None = HttpOpt) -> None:
    """List registered models, or the versions (with aliases and lineage) of one."""
    from ..lifecycle.registry import Registry

    reg = Registry(_store(url, endpoint, region, allow_http))
    if model is None:
        names = reg.models()
        if json_out:
            emit_json({n: reg.aliases(n) for n in names})
            return
        table = Table("model", "versions", "aliases")
        for n in names:
            table.add_row(n, str(len(reg.versions(n))), ", ".join(f"{a}={v}" for a, v in reg.aliases(n).items()))
        console.print(table)
        return
    versions = reg.versions(model)
    if not versions:
        raise NotFoundError(f"no model {model!r} in the registry of {reg.store.url} (models: {reg.models()[:10]})")
    aliases = reg.aliases(model)
    if json_out:
        emit_json({"model": model, "aliases": aliases, "versions": [v.to_json() for v in versions]})
        return
    table = Table("version", "aliases", "checkpoint", "kind", "id", "dataset", "metrics", "registered",
                  title=f"model {escape(model)}")
    for mv in versions:
        table.add_row(*_version_row(mv, aliases))
    console.print(table)


@ckpt_app.command("alias")
@handle_errors
def alias_cmd(url: str, model: str = typer.Option(..., "--model", "-m"),
              name: str | None = typer.Argument(None, help="alias name (omit to list aliases)"),
              set_to: int | None = typer.Option(None, "--set", help="point the alias at this version"),
              promote: int | None = typer.Option(None, "--promote",
                                                    help="make VERSION this alias; its old target becomes --fallback"),
              fallback: str = typer.Option("fallback", "--fallback", help="alias that --promote moves the old target to"),
              rollback: bool = typer.Option(False, "--rollback", help="move the alias back (see --to)"),
              to: str | None = typer.Option(None, "--to", help="with --rollback: to this alias's target "
                                               "(default: fallback; 'previous' = the alias's own previous target)"),
              remove: bool = typer.Option(False, "--remove"), history: bool = typer.Option(False, "--history"),
              json_out: bool = JsonOpt, endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
              allow_http: bool | None = HttpOpt) -> None:
    """Show, set, promote, roll back or remove a model alias (latest, stable, fallback, ...)."""
    from ..lifecycle.registry import Registry

    reg = Registry(_store(url, endpoint, region, allow_http))
    if sum(x for x in (set_to is not None, promote is not None, rollback, remove)) > 1:
        raise ConfigError("use one of --set, --promote, --rollback, --remove")
    if name is None:
        if set_to is not None or promote is not None or rollback or remove or history:
            raise ConfigError("name the alias to change, e.g. `trainstore ckpt alias URL -m llm stable --set 3`")
        aliases = reg.aliases(model)
        if not aliases and not reg.versions(model):
            raise NotFoundError(f"no model {model!r} in the registry of {reg.store.url} (models: {reg.models()[:10]})")
        if json_out:
            emit_json(aliases)
            return
        table = Table("alias", "version", "checkpoint", title=f"model {escape(model)}")
        for a, v in aliases.items():
            mv = reg.version(model, v)
            table.add_row(a, str(v), f"{mv.job}@{mv.step}")
        console.print(table)
        return
    if set_to is not None:
        reg.set_alias(model, name, set_to)
    elif promote is not None:
        reg.promote(model, promote, alias=name, fallback=fallback)
    elif rollback:
        reg.rollback(model, name, to=None if to == "previous" else (to or "fallback"))
    elif remove:
        reg.remove_alias(model, name)
    if history:
        events = reg.history(model, name)
        if not events:
            raise NotFoundError(f"model {model!r} has no alias {name!r}")
        if json_out:
            emit_json([e.to_json() for e in events])
            return
        table = Table("seq", "action", "version", "previous", "at", "by", title=f"{escape(model)}@{escape(name)}")
        for e in events:
            table.add_row(str(e.seq), e.action, str(e.version), str(e.previous), _when(e.at), escape(e.by or "-"))
        console.print(table)
        return
    mv = reg.resolve_alias(model, name) if not remove else None
    if json_out:
        emit_json({"model": model, "alias": name, "version": mv.to_json() if mv else None})
        return
    console.print(f"{model}@{name} -> " + (f"version {mv.version} ({mv.job}@{mv.step})" if mv else "removed"))


# -- export ---------------------------------------------------------------------------------
@ckpt_app.command("export")
@handle_errors
def export(url: str, ref: str | None = typer.Argument(None, help="model version: MODEL@ALIAS or MODEL@N"),
           to: str = typer.Option(..., "--to", help="output FILE.safetensors (+ FILE.safetensors.sha256)"),
           job: str | None = typer.Option(None, "--job", "-j", help="export a checkpoint instead of a version"),
           step: int | None = typer.Option(None, "--step", "-s"),
           dtype: str | None = typer.Option(None, "--dtype", help="cast floats to bf16 or fp16"),
           only: str | None = typer.Option(None, "--only", help="only tensors under this prefix, e.g. model/"),
           json_out: bool = JsonOpt, endpoint: str | None = EndpointOpt, region: str | None = RegionOpt,
           allow_http: bool | None = HttpOpt) -> None:
    """Export a model version (or --job/--step) to safetensors, optionally cast to bf16/fp16."""
    from ..lifecycle.export import export_safetensors, export_version
    from ..lifecycle.registry import Registry

    store = _store(url, endpoint, region, allow_http)
    with console.status("exporting ...") if not json_out else _progress(False):
        if ref is not None:
            if job is not None or step is not None:
                raise ConfigError("pass either a model version or --job/--step, not both")
            res = export_version(Registry(store), ref, to, dtype=dtype, only=only)
        else:
            if job is None or step is None:
                raise ConfigError("name a model version (MODEL@ALIAS) or both --job and --step")
            res = export_safetensors(store, job, step, to, dtype=dtype, only=only)
    if json_out:
        emit_json(res.to_json())
        return
    console.print(f"exported {res.job}@{res.step} -> {escape(res.path)}: {res.tensors} tensors, {res.bytes:,} B"
                  f"{f', cast to {res.dtype}' if res.dtype else ''}; sha256 in {escape(res.checksum_path)}")


# -- stats ----------------------------------------------------------------------------------
@ckpt_app.command("stats")
@handle_errors
def stats(url: str, job: str = JobOpt, json_out: bool = JsonOpt, endpoint: str | None = EndpointOpt,
          region: str | None = RegionOpt, allow_http: bool | None = HttpOpt) -> None:
    """Checkpoint frequency, storage used, restore count and recovery success rate of a job."""
    from ..lifecycle.metrics import load_stats

    store = _store(url, endpoint, region, allow_http)
    manifests = [m for m in mf.list_manifests(store, job) if isinstance(m, mf.Manifest)]
    if not manifests and not list(store.list(mf.job_prefix(job))):
        raise NotFoundError(f"job {job!r} has no checkpoints in {store.url}")
    created = sorted(m.created for m in manifests if m.created)
    gaps = [b - a for a, b in zip(created, created[1:])]
    sizes = {meta.key: meta.size for meta in store.list("chunks/")}
    keys: set[str] = set()
    for m in manifests:
        keys |= mf.manifest_chunk_keys(m)
    counters = load_stats(store, job)
    restores = counters["restores"]
    out = {
        "job": job, "checkpoints": len(manifests),
        "full": sum(m.kind == "full" for m in manifests), "incremental": sum(m.kind == "incremental" for m in manifests),
        "first": created[0] if created else None, "last": created[-1] if created else None,
        "median_interval_s": statistics.median(gaps) if gaps else None,
        "per_hour": (len(created) - 1) / ((created[-1] - created[0]) / 3600) if len(created) > 1 and created[-1] > created[0] else None,
        "logical_bytes": sum(m.logical_bytes for m in manifests),
        "stored_bytes": sum(sizes.get(k, 0) for k in keys),  # unique chunks this job references
        "missing_chunks": sum(1 for k in keys if k not in sizes),
        "store_chunk_bytes": sum(sizes.values()),
        "saves_observed": counters["saves"], "save_failures": counters["save_failures"],
        "mean_blocking_s": counters["blocked_seconds"] / counters["saves"] if counters["saves"] else None,
        "mean_save_s": counters["save_seconds"] / counters["saves"] if counters["saves"] else None,
        "restores": restores, "restores_ok": counters["restores_ok"], "fallbacks": counters["fallbacks"],
        "recovery_success_rate": counters["restores_ok"] / restores if restores else None,
        "verifications": counters["verifications"], "verify_failures": counters["verify_failures"],
        "processes_reporting": counters["processes"], "at": time.time(),
    }
    if json_out:
        emit_json(out)
        return
    table = Table("", "value", title=f"{escape(store.url)} job {escape(job)}")
    ratio = out["stored_bytes"] / out["logical_bytes"] if out["logical_bytes"] else None
    rows = [
        ("checkpoints", f"{out['checkpoints']} ({out['full']} full, {out['incremental']} incremental)"),
        ("first / last", f"{_when(out['first'])} / {_when(out['last'])}"),
        ("frequency", "-" if out["median_interval_s"] is None else
         f"every {out['median_interval_s']:,.1f}s (median), {out['per_hour'] or 0:,.1f}/hour"),
        ("storage used", f"{out['stored_bytes']:,} B stored for {out['logical_bytes']:,} B logical"
         + (f" (x{ratio:.3f})" if ratio is not None else "")),
        ("saves observed", f"{int(out['saves_observed'])} ({int(out['save_failures'])} failed), blocking "
         f"{_secs(out['mean_blocking_s'])}, save {_secs(out['mean_save_s'])} (mean)"),
        ("restores", f"{int(restores)} ({int(out['restores_ok'])} ok, {int(out['fallbacks'])} checkpoints skipped)"),
        ("recovery success rate", "-" if out["recovery_success_rate"] is None else f"{out['recovery_success_rate']:.1%}"),
        ("verifications", f"{int(out['verifications'])} ({int(out['verify_failures'])} failed)"),
    ]
    if out["missing_chunks"]:
        rows.append(("[red]missing chunks[/red]", str(out["missing_chunks"])))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)


__all__ = ["restore", "retain", "gc", "tier", "register_cmd", "models", "alias_cmd", "export", "stats"]
