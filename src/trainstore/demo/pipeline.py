"""``run_demo``: the whole pipeline on one store, with progress bars, a summary and a report.

    ingest -> clean -> features -> train (Loader, async full + incremental checkpoints, hot
    tier -> durable store) -> crash (SIGKILL) + resume, compared bit for bit -> corrupt a
    checkpoint, restore() skips it -> registry (stable), retention, archive, gc, export

The run record (timings, per-step figures, checkpoint sizes, recovery, lifecycle, storage by
tier, lineage) is saved in the store as ``reports/demo-run.json``; the HTML report is rendered
from it, so ``trainstore report`` can regenerate it from the store alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError
from ..store import open_store
from . import crash, datastages, inventory, lifecycle_stage, recovery
from .config import DemoConfig, DemoPaths
from .context import RunContext, make_progress
from .report import save_run, write_report
from .summary import compute_summary, print_summary

DEFAULT_STORE = "./.demo/store"
DEFAULT_WORK = "./.demo/work"
DEFAULT_REPORT = "./.demo/report.html"
MARKER = ".trainstore-demo"
OWNER_KEY = "reports/demo-owner.json"


def _owned_dir(path: str, what: str) -> None:
    """Empty ``path`` if the demo created it (marker file); refuse a foreign non-empty one."""
    if os.path.isdir(path) and os.listdir(path):
        if not os.path.exists(os.path.join(path, MARKER)):
            raise ConfigError(f"{what} {path!r} is not empty and was not created by trainstore demo; "
                              "pick another directory")
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, MARKER), "w") as f:
        f.write("created by trainstore demo; emptied at the next run\n")


def _prepare_store(url: str, options: dict, overwrite: bool) -> Any:
    """Open the store, emptied: a store that a previous demo run filled (it holds the
    ``OWNER_KEY`` object) is emptied; any other non-empty store only with ``overwrite``."""
    local = "://" not in url or url.startswith("file://")
    if local:
        path = os.path.abspath(url[len("file://"):] if url.startswith("file://") else url)
        os.makedirs(path, exist_ok=True)
        url = path
    store = open_store(url, **options)
    first = next(iter(store.list("")), None)
    if first is not None:
        if not (overwrite or store.exists(OWNER_KEY)):
            raise ConfigError(f"store {store.url} is not empty (e.g. {first.key!r}) and was not filled by "
                              "trainstore demo; use an empty location or pass --overwrite to delete everything "
                              "under it first")
        if local:
            shutil.rmtree(url)
            os.makedirs(url)
        else:
            for meta in list(store.list("")):
                store.delete(meta.key)
    store.put(OWNER_KEY, json.dumps({"created_by": "trainstore demo", "at": time.time()}).encode())
    return store


@contextlib.contextmanager
def _log_to(path: str) -> Iterator[None]:
    """trainstore's log records (e.g. the expected corruption warnings) go to a file, not
    between the progress bars; the summary says what happened."""
    logger = logging.getLogger("trainstore")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def report_command(store_url: str, options: dict, out: str) -> str:
    """The ``trainstore report`` command line that regenerates ``out`` from the same store: with
    the endpoint options the run used (without them an s3:// URL goes to the real cloud)."""
    args = ["trainstore", "report", "--store", shlex.quote(store_url)]
    if options.get("endpoint"):
        args += ["--endpoint", shlex.quote(str(options["endpoint"]))]
    if options.get("region"):
        args += ["--region", shlex.quote(str(options["region"]))]
    if options.get("allow_http") is not None:
        args.append("--allow-http" if options["allow_http"] else "--no-allow-http")
    return " ".join([*args, "--out", shlex.quote(out)])


def run_demo(store_url: str = DEFAULT_STORE, store_options: dict | None = None, *, size: str = "default",
             work_dir: str = DEFAULT_WORK, report_path: str = DEFAULT_REPORT, overwrite: bool = False,
             console: Console | None = None) -> dict:
    """Run every stage; returns the run record (also saved in the store)."""
    console = console or Console()
    options = dict(store_options or {})
    config = DemoConfig.for_size(size)
    started = time.time()
    t0 = time.perf_counter()
    store = _prepare_store(store_url, options, overwrite)
    work = os.path.abspath(work_dir)
    _owned_dir(work, "work directory")
    paths = DemoPaths(work)
    console.print(f"[bold]trainstore demo[/bold] ({size}): store [cyan]{escape(store.url)}[/cyan], "
                  f"hot tier and scratch in [cyan]{escape(work)}[/cyan]")
    log_path = os.path.join(work, "demo.log")
    progress = make_progress(console)
    ctx = RunContext(store, store.url, options, config, paths, console, progress)
    ctx.record.update(store=store.url, config=config.to_json(), started=started)
    with progress, _log_to(log_path):
        raw = datastages.ingest(ctx)
        clean = datastages.clean_stage(ctx, raw)
        train_ref, val_ref = datastages.features(ctx, clean)
        crash.train_stage(ctx, train_ref, val_ref)
        crash.crash_stage(ctx, train_ref, val_ref)
        recovery.corrupt_stage(ctx, crash.JOB)
        life = lifecycle_stage.lifecycle_stage(ctx, crash.JOB, train_ref)
        with ctx.stage("report", total=2, unit="") as task:
            kept = len(life["retention"]["decisions"]) - life["retention"]["deleted"] - len(life["archived"])
            ctx.record["storage"] = inventory.storage_by_tier(
                store, {"feature shards (loader cache)": paths.data_cache, "checkpoint chunks": paths.ckpt_hot},
                open_store(paths.archive), {"export": paths.export})
            ctx.record["lineage"] = inventory.lineage(store, [train_ref, val_ref], crash.JOB, kept, life["model"],
                                                      life["export"])
            ctx.advance(task)
            ctx.record["total_s"] = time.perf_counter() - t0
            ctx.record["finished"] = time.time()
            save_run(store, ctx.record)
            ctx.record["report"] = write_report(ctx.record, report_path)
            ctx.advance(task)
    ctx.record["total_s"] = time.perf_counter() - t0
    print_summary(console, compute_summary(ctx.record))
    console.print(f"report: [cyan]{escape(ctx.record['report'])}[/cyan] (regenerate with "
                  f"`{escape(report_command(store_url, options, ctx.record['report']))}`); log: {escape(log_path)}")
    return ctx.record


__all__ = ["DEFAULT_REPORT", "DEFAULT_STORE", "DEFAULT_WORK", "report_command", "run_demo"]
