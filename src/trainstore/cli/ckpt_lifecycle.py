"""Lifecycle commands of ``trainstore ckpt``: restore, retain, gc, tier, stats.

Every command prints a rich table, or JSON with ``--json``; long operations show a progress
bar on stderr. Bad input (a retention rule set that would delete every checkpoint, a job
without checkpoints) is one red line and exit status 2. The ``ckpt`` group
(``cli/ckpt.py``) merges these commands with the inspection and model ones.
"""

from __future__ import annotations

import statistics
import time

import typer
from rich.markup import escape
from rich.table import Table

from ..checkpoint.format import layout, manifest as mf
from ..errors import ConfigError
from .common import (
    JobOpt,
    JsonOpt,
    StoreFlags,
    console,
    emit_json,
    handle_errors,
    not_found,
    print_table,
    progress_bar,
    require_job,
    secs,
    when,
    with_store_flags,
)

commands = typer.Typer()


# -- restore --------------------------------------------------------------------------------
@commands.command("restore")
@handle_errors
@with_store_flags
def restore(url: str, job: str = JobOpt, to: str = typer.Option(..., "--to", help="output FILE.safetensors"),
            step: int | None = typer.Option(None, "--step", "-s", help="default: newest that verifies"),
            best: str | None = typer.Option(None, "--best", help="restore the best checkpoint by this metric"),
            mode: str = typer.Option("min", "--mode", help="min or max (with --best)"),
            dtype: str | None = typer.Option(None, "--dtype", help="cast floats to bf16 or fp16"),
            only: str | None = typer.Option(None, "--only", help="only tensors under this prefix, e.g. model/"),
            json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Restore a checkpoint (falling back past bad ones) and write its tensors as safetensors."""
    from ..checkpoint.manager import CheckpointManager
    from ..lifecycle.export import state_tensors, write_safetensors
    from ..lifecycle.metrics import CheckpointMetrics

    if not to.endswith(".safetensors"):
        raise ConfigError(f"--to must name a .safetensors file, got {to!r}")
    store = flags.open(url)
    metrics = CheckpointMetrics(store=store)  # the restore counts in `ckpt stats`
    with CheckpointManager(store, job, observers=[metrics.observe]) as mgr:
        with console.status(f"restoring {job} ...") if not json_out else progress_bar(False):
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
@commands.command("retain")
@handle_errors
@with_store_flags
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
           json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
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
    store = flags.open(url)
    require_job(store, job)
    plan = rt.apply_retention(store, job, policy, dry_run=dry_run, allow_delete_all=allow_delete_all)
    if json_out:
        emit_json(plan.to_json())
        return
    title = f"{escape(store.url)} job {escape(job)}: {rt.describe(policy)}" + (" [dry run]" if dry_run else "")
    table = Table("step", "kind", "created", "decision", "why", title=title)
    for d in plan.decisions:
        mark = "[green]keep[/green]" if d.keep else ("[yellow]would delete[/yellow]" if dry_run else "[red]deleted[/red]")
        table.add_row(str(d.step), d.kind, when(d.created), mark, escape("; ".join(d.reasons)))
    print_table(table, wrap=("why",))
    freed = sum(d.stored_bytes for d in plan.deleted)
    console.print(f"{len(plan.kept)} kept, {len(plan.deleted)} {'would be ' if dry_run else ''}deleted "
                  + (f"(up to {freed:,} B of chunks freed)" if dry_run else
                     f"({plan.reclaimed_bytes:,} B of chunks reclaimed now; what another job or a lease still "
                     "needed is left to `ckpt gc`)"))


# -- garbage collection ---------------------------------------------------------------------
@commands.command("gc")
@handle_errors
@with_store_flags
def gc(url: str, grace: str = typer.Option("1h", "--grace", help="only delete chunks older than this"),
       dry_run: bool = typer.Option(False, "--dry-run", help="report what would be deleted"),
       ignore_unreadable: bool = typer.Option(False, "--ignore-unreadable",
                                              help="sweep even if a manifest is unreadable"),
       json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Delete chunks no checkpoint references (safe while training saves: see docs/lifecycle.md)."""
    from ..lifecycle.gc import GcOptions, collect_garbage

    store = flags.open(url)
    with progress_bar(not json_out) as progress:
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
    table.add_row("unreferenced, within grace", f"{rep.too_young:,}", f"{rep.too_young_bytes:,}")
    table.add_row("would delete" if dry_run else "deleted", f"{rep.deleted:,}", f"{rep.bytes_reclaimed:,}")
    print_table(table)
    console.print(f"{rep.manifests} manifests of {rep.jobs} jobs, {rep.leases} live save leases, {rep.seconds:.2f}s")
    if rep.next_reclaim_at is not None:  # when the rest goes (retention reclaims what it releases at once)
        console.print(f"{rep.too_young:,} unreferenced chunks within the grace period: reclaimable from "
                      f"{when(rep.next_reclaim_at)} by a gc then (each {grace} after it was written)")
    if rep.missing:
        console.print(f"[red]{rep.missing} referenced chunks are missing[/red]: run `trainstore ckpt verify`")


# -- tiering --------------------------------------------------------------------------------
@commands.command("tier")
@handle_errors
@with_store_flags
def tier(hot: str, job: str = JobOpt, durable: str = typer.Option(..., "--durable", help="durable tier URL"),
         archive: str | None = typer.Option(None, "--archive", help="archive tier URL"),
         sync: bool = typer.Option(False, "--sync", help="copy hot checkpoints the durable tier lacks"),
         evict: bool = typer.Option(False, "--evict", help="evict durable checkpoints past the hot rule"),
         keep_hot: int = typer.Option(2, "--keep-hot", help="hot rule: keep the N newest in hot"),
         archive_after: str | None = typer.Option(None, "--archive-after",
                                                     help="move durable full checkpoints older than this to --archive"),
         dry_run: bool = typer.Option(False, "--dry-run"), json_out: bool = JsonOpt,
         flags: StoreFlags = StoreFlags()) -> None:
    """Status per checkpoint (hot / durable / archived, created -> ready -> durable), and actions."""
    from ..lifecycle.tiering import Tiering, TierPolicy

    # the hot and archive tiers must exist; the durable one is created only to --sync into it
    tiers = Tiering(flags.open(hot), flags.open(durable, create=sync and not dry_run),
                    archive=flags.open(archive) if archive else None,
                    policy=TierPolicy(hot_keep_last=keep_hot, archive_after=archive_after))
    actions: dict[str, list[int]] = {}
    if sync:
        missing = [s for s in mf.list_steps(tiers.hot, job) if not tiers.durable.exists(mf.manifest_key(job, s))]
        actions["synced"] = missing
        if not dry_run:
            with progress_bar(not json_out) as progress:
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
        table.add_row(str(s.step), s.kind, s.tiers, when(s.created), secs(s.restore_ready_s), secs(s.durable_s))
    print_table(table)


# -- stats ----------------------------------------------------------------------------------
@commands.command("stats")
@handle_errors
@with_store_flags
def stats(url: str, job: str = JobOpt, json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Checkpoint frequency, storage used, saves, verifications and restores of a job.

    Saves and verifications come from what the store holds (manifests, verify records);
    timings, failures and restores from the stats files of processes that ran with a
    ``CheckpointMetrics(store=...)`` observer (``ckpt restore`` is one), else "not recorded"."""
    from ..lifecycle.metrics import load_stats

    store = flags.open(url, read_only=True)
    manifests = [m for m in mf.list_manifests(store, job) if isinstance(m, mf.Manifest)]
    if not manifests and not list(store.list(mf.job_prefix(job))):
        raise not_found("job", job, mf.list_jobs(store), store)
    created = sorted(m.created for m in manifests if m.created)
    gaps = [b - a for a, b in zip(created, created[1:])]
    sizes = {meta.key: meta.size for meta in store.list("chunks/")}
    keys: set[str] = set()
    for m in manifests:
        keys |= mf.manifest_chunk_keys(m)
    records = [r for r in (mf.load_verify_record(store, job, m.step, m) for m in manifests) if r is not None]
    counters = load_stats(store, job)
    restores = counters["restores"]
    recorded = counters["processes"] > 0
    out = {
        "job": job, "checkpoints": len(manifests),
        "full": sum(m.kind == "full" for m in manifests), "incremental": sum(m.kind == "incremental" for m in manifests),
        "saves": len(manifests), "abandoned": len(layout.list_abandoned(store, job)),
        "first": created[0] if created else None, "last": created[-1] if created else None,
        "median_interval_s": statistics.median(gaps) if gaps else None,
        "per_hour": (len(created) - 1) / ((created[-1] - created[0]) / 3600) if len(created) > 1 and created[-1] > created[0] else None,
        "logical_bytes": sum(m.logical_bytes for m in manifests),
        "stored_bytes": sum(sizes.get(k, 0) for k in keys),  # unique chunks this job references
        "missing_chunks": sum(1 for k in keys if k not in sizes),
        "store_chunk_bytes": sum(sizes.values()),
        "verified": len(records), "verified_bad": sum(not r.ok for r in records),
        "last_verified": max((r.checked_at for r in records), default=None),
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
    by = f"recorded by {int(counters['processes'])} process{'es' if counters['processes'] != 1 else ''}"
    unrecorded = "not recorded (no process saved stats here: run with CheckpointMetrics(store=...) as an observer)"
    rows = [
        ("checkpoints", f"{out['checkpoints']} ({out['full']} full, {out['incremental']} incremental)"),
        ("first / last", f"{when(out['first'])} / {when(out['last'])}"),
        ("frequency", "-" if out["median_interval_s"] is None else
         f"every {out['median_interval_s']:,.1f}s (median), {out['per_hour'] or 0:,.1f}/hour"),
        ("storage used", f"{out['stored_bytes']:,} B stored for {out['logical_bytes']:,} B logical"
         + (f" (x{ratio:.3f})" if ratio is not None else "")),
        ("saves", f"{out['saves']} committed" + (f", {out['abandoned']} abandoned by rollbacks" if out["abandoned"] else "")
         + (f"; {int(out['save_failures'])} failed ({by})" if recorded else "")),
        ("save time", f"blocking {secs(out['mean_blocking_s'])}, save {secs(out['mean_save_s'])} (mean of "
         f"{int(out['saves_observed'])} saves {by})" if out["saves_observed"] else unrecorded),
        ("restores", f"{int(restores)} ({int(out['restores_ok'])} ok, {int(out['fallbacks'])} checkpoints skipped; "
         f"{by})" if recorded else unrecorded),
        ("recovery success rate", "-" if out["recovery_success_rate"] is None else f"{out['recovery_success_rate']:.1%}"),
        ("verifications", f"{out['verified']} of {out['checkpoints']} checkpoints verified ({out['verified_bad']} bad)"
         + (f", last {when(out['last_verified'])}" if out["last_verified"] else "")),
    ]
    if out["missing_chunks"]:
        rows.append(("[red]missing chunks[/red]", str(out["missing_chunks"])))
    for k, v in rows:
        table.add_row(k, v)
    print_table(table, wrap=("value",))
