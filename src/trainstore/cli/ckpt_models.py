"""Model commands of ``trainstore ckpt``: register, models, alias, export.

A registered checkpoint is a model version (kept forever by retention), with aliases
(latest, stable, fallback, ...) and an export to safetensors. Bad input (an unknown model or
alias, an export of a missing step) is one red line and exit status 2.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import ConfigError, NotFoundError
from .common import (
    JobOpt,
    JsonOpt,
    StoreFlags,
    console,
    emit_json,
    handle_errors,
    metrics_text,
    not_found,
    print_table,
    progress_bar,
    store_contents,
    when,
    with_store_flags,
)

commands = typer.Typer()


# -- registry -------------------------------------------------------------------------------
def _version_row(mv: Any, aliases: dict[str, int]) -> list[str]:
    names = ", ".join(a for a, v in sorted(aliases.items()) if v == mv.version)
    return [str(mv.version), names, f"{mv.job}@{mv.step}", mv.kind, mv.checkpoint_id[:12], mv.dataset or "-",
            escape(metrics_text(mv.metrics)), when(mv.created)]


@commands.command("register")
@handle_errors
@with_store_flags
def register_cmd(url: str, job: str = JobOpt, step: int = typer.Option(..., "--step", "-s"),
                 model: str = typer.Option(..., "--model", "-m", help="model name"),
                 alias: list[str] = typer.Option(["latest"], "--alias", "-a", help="aliases to move (repeatable)"),
                 dataset: str | None = typer.Option(None, "--dataset", help="dataset version, e.g. tokens@3"),
                 note: str | None = typer.Option(None, "--note"), json_out: bool = JsonOpt,
                 flags: StoreFlags = StoreFlags()) -> None:
    """Register a checkpoint as the next version of a model (kept forever by retention)."""
    from ..lifecycle.registry import Registry

    reg = Registry(flags.open(url))
    mv = reg.register(job, step, model, dataset=dataset, note=note, aliases=tuple(alias))
    if json_out:
        emit_json(mv.to_json())
        return
    console.print(f"registered {job}@{step} as [bold]{mv.ref}[/bold]" + (f" ({', '.join(alias)})" if alias else ""))


@commands.command("models")
@handle_errors
@with_store_flags
def models(url: str, name: str | None = typer.Argument(None, help="a model's name: list its versions"),
           model: str | None = typer.Option(None, "--model", "-m", help="the same as NAME"),
           json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """List registered models, or the versions (with aliases and lineage) of the model NAME."""
    from ..lifecycle.registry import Registry

    if name is not None and model is not None and name != model:
        raise ConfigError(f"name one model: {name!r} or --model {model!r}")
    model = model or name
    reg = Registry(flags.open(url, read_only=True))
    if model is None:
        names = reg.models()
        if not names:
            raise NotFoundError(f"no registered models in {reg.store.url}: {store_contents(reg.store)} "
                                "(`trainstore ckpt register URL -j JOB -s STEP -m NAME` registers one)")
        if json_out:
            emit_json({n: reg.aliases(n) for n in names})
            return
        table = Table("model", "versions", "aliases")
        for n in names:
            table.add_row(n, str(len(reg.versions(n))), ", ".join(f"{a}={v}" for a, v in reg.aliases(n).items()))
        print_table(table)
        return
    versions = reg.versions(model)
    if not versions:
        raise not_found("model", model, reg.models(), reg.store)
    aliases = reg.aliases(model)
    if json_out:
        emit_json({"model": model, "aliases": aliases, "versions": [v.to_json() for v in versions]})
        return
    table = Table("version", "aliases", "checkpoint", "kind", "id", "dataset", "metrics", "registered",
                  title=f"model {escape(model)}")
    for mv in versions:
        table.add_row(*_version_row(mv, aliases))
    print_table(table, wrap=("metrics",))


@commands.command("alias")
@handle_errors
@with_store_flags
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
              json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Show, set, promote, roll back or remove a model alias (latest, stable, fallback, ...)."""
    from ..lifecycle.registry import Registry

    reg = Registry(flags.open(url))
    if sum(x for x in (set_to is not None, promote is not None, rollback, remove)) > 1:
        raise ConfigError("use one of --set, --promote, --rollback, --remove")
    if name is None:
        if set_to is not None or promote is not None or rollback or remove or history:
            raise ConfigError("name the alias to change, e.g. `trainstore ckpt alias URL -m llm stable --set 3`")
        aliases = reg.aliases(model)
        if not aliases and not reg.versions(model):
            raise not_found("model", model, reg.models(), reg.store)
        if json_out:
            emit_json(aliases)
            return
        table = Table("alias", "version", "checkpoint", title=f"model {escape(model)}")
        for a, v in aliases.items():
            mv = reg.version(model, v)
            table.add_row(a, str(v), f"{mv.job}@{mv.step}")
        print_table(table)
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
            table.add_row(str(e.seq), e.action, str(e.version), str(e.previous), when(e.at), escape(e.by or "-"))
        print_table(table)
        return
    mv = reg.resolve_alias(model, name) if not remove else None
    if json_out:
        emit_json({"model": model, "alias": name, "version": mv.to_json() if mv else None})
        return
    console.print(f"{model}@{name} -> " + (f"version {mv.version} ({mv.job}@{mv.step})" if mv else "removed"))


# -- export ---------------------------------------------------------------------------------
@commands.command("export")
@handle_errors
@with_store_flags
def export(url: str, ref: str | None = typer.Argument(None, help="model version: MODEL@ALIAS or MODEL@N"),
           to: str = typer.Option(..., "--to", help="output FILE.safetensors (+ FILE.safetensors.sha256)"),
           job: str | None = typer.Option(None, "--job", "-j", help="export a checkpoint instead of a version"),
           step: int | None = typer.Option(None, "--step", "-s"),
           dtype: str | None = typer.Option(None, "--dtype", help="cast floats to bf16 or fp16"),
           only: str | None = typer.Option(None, "--only", help="only tensors under this prefix, e.g. model/"),
           all_state: bool = typer.Option(False, "--all", help="also the optimizer, RNG and other training "
                                          "state (default: the model's weights only)"),
           json_out: bool = JsonOpt, flags: StoreFlags = StoreFlags()) -> None:
    """Export a model version (or --job/--step) to safetensors, optionally cast to bf16/fp16: the
    model's weights, without optimizer, RNG and loader state unless --all."""
    from ..lifecycle.export import export_safetensors, export_version
    from ..lifecycle.registry import Registry

    store = flags.open(url)
    with console.status("exporting ...") if not json_out else progress_bar(False):
        if ref is not None:
            if job is not None or step is not None:
                raise ConfigError("pass either a model version or --job/--step, not both")
            res = export_version(Registry(store), ref, to, dtype=dtype, only=only, weights_only=not all_state)
        else:
            if job is None or step is None:
                raise ConfigError("name a model version (MODEL@ALIAS) or both --job and --step")
            res = export_safetensors(store, job, step, to, dtype=dtype, only=only, weights_only=not all_state)
    if json_out:
        emit_json(res.to_json())
        return
    console.print(f"exported {res.job}@{res.step} -> {escape(res.path)}: {res.tensors} tensors, {res.bytes:,} B"
                  f"{f', cast to {res.dtype}' if res.dtype else ''}; sha256 in {escape(res.checksum_path)}")
