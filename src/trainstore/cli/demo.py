"""``trainstore demo`` (the end-to-end pipeline, ``trainstore.demo``) and ``trainstore report``;
``trainstore demo --foundation``: a small run of what the foundation offers.

On a store (a local directory by default) it writes weight-like float32 and bf16 tensors as
content-addressed chunks with every codec, shows compression and dedup, reads everything
back bit-exactly, corrupts a canary chunk to show detection, and lists the store.
``run_foundation_demo`` is reusable by a fuller pipeline demo.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from ..bytebudget import ByteBudget
from ..chunks import ChunkRef, ChunkStore
from ..codecs import CODECS, CodecConfig
from ..errors import ChunkCorruptError, ConfigError
from ..store import Store, open_store
from .common import StoreFlags, console as default_console, handle_errors, with_store_flags

DEFAULT_STORE = "./.demo/store"
# The full pipeline (trainstore.demo.pipeline) uses the same defaults; duplicated here so the
# CLI imports nothing heavy until a command runs.
DEFAULT_PIPELINE_STORE = "./.demo/store"
DEFAULT_WORK = "./.demo/work"
DEFAULT_REPORT = "./.demo/report.html"
#: Everything the demo writes lives under this prefix (cleared at the start of each run, so
#: a rerun shows real writes, and nothing else in a store pointed to with --store is touched).
DEMO_PREFIX = "demo"
CHUNK_BYTES = 1 << 20


def _weight_like(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """normal(0, 0.02) float32, the usual initial scale of transformer weights."""
    return np.random.default_rng(seed).normal(0.0, 0.02, shape).astype(np.float32)


def _bf16(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (the top half of each float32, round-to-nearest-even)."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def demo_tensors() -> dict[str, np.ndarray]:
    """A tiny "model": two float32 matrices, their bf16 copies, and a tied (duplicate) one."""
    w1 = _weight_like(1, (1024, 1024))
    w2 = _weight_like(2, (512, 1024))
    return {
        "layer0.weight (f32)": w1,
        "layer1.weight (f32)": w2,
        "layer0.weight (bf16)": _bf16(w1),
        "layer1.weight (bf16)": _bf16(w2),
        "lm_head.weight (f32, tied to layer0)": w1.copy(),
    }


def _split(arr: np.ndarray) -> list[memoryview]:
    view = memoryview(np.ascontiguousarray(arr)).cast("B")
    return [view[i : i + CHUNK_BYTES] for i in range(0, view.nbytes, CHUNK_BYTES)] or [view]


def _write_all(chunks: ChunkStore, tensors: dict[str, np.ndarray], codec: str) -> dict[str, Any]:
    """Write every tensor with ``codec``; returns refs and byte/dedup counts per dtype."""
    refs: dict[str, list[ChunkRef]] = {}
    stats: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    budget = ByteBudget(8 * CHUNK_BYTES)  # bounds the compressed buffers alive at once
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="trainstore-demo") as pool:
        futures = {name: [budget.submit(pool, c.nbytes, chunks.put, c, codec=codec, itemsize=arr.itemsize)
                          for c in _split(arr)]
                   for name, arr in tensors.items()}
        for name, futs in futures.items():
            kind = "bf16" if "bf16" in name else "f32"
            s = stats.setdefault(kind, {"raw": 0, "stored": 0, "written": 0, "deduped": 0})
            refs[name] = []
            for fut in futs:
                res = fut.result()
                refs[name].append(res.ref)
                s["raw"] += res.ref.size
                s["stored"] += res.ref.stored
                s["written" if res.written else "deduped"] += 1
    return {"refs": refs, "stats": stats, "seconds": time.perf_counter() - started}


def _read_back(chunks: ChunkStore, tensors: dict[str, np.ndarray], refs: dict[str, list[ChunkRef]]) -> float:
    started = time.perf_counter()
    for name, arr in tensors.items():
        out = np.empty_like(arr)
        view = memoryview(out).cast("B")
        pos = 0
        for ref in refs[name]:
            chunks.get(ref, out=view[pos : pos + ref.size])
            pos += ref.size
        if not np.array_equal(out.view(np.uint8), arr.view(np.uint8)):
            raise AssertionError(f"{name} did not read back bit-exactly")
    return time.perf_counter() - started


def _corruption_check(store: Store) -> str:
    """Write a canary chunk under its own prefix, flip one byte, show the error, restore."""
    canary = ChunkStore(store, prefix=f"{DEMO_PREFIX}/canary/chunks")
    ref = canary.put(_weight_like(7, (64, 1024)), codec="shuffle-zstd", itemsize=4).ref
    key = ref.key(canary.prefix)
    good = bytes(memoryview(store.get(key)))
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    store.put(key, bad)
    try:
        canary.get(ref)
    except ChunkCorruptError as exc:
        message = str(exc)
    else:  # pragma: no cover - would mean verification is broken
        raise AssertionError("a flipped byte went unnoticed")
    finally:
        store.put(key, good)
    canary.get(ref)  # restored and verified again
    return message


def run_foundation_demo(store_url: str = DEFAULT_STORE, options: dict | None = None,
                        console: Console | None = None) -> dict[str, Any]:
    """Run the foundation demo on ``store_url``; prints rich tables, returns the figures."""
    con = console or default_console
    store = open_store(store_url, **(options or {}))
    for meta in list(store.list(f"{DEMO_PREFIX}/")):
        store.delete(meta.key)
    tensors = demo_tensors()
    raw_total = sum(a.nbytes for a in tensors.values())
    con.print(f"[bold]trainstore foundation demo[/bold] on {escape(store.url)}")
    con.print(f"{len(tensors)} weight-like tensors (normal(0, 0.02)), {raw_total / 2**20:.1f} MiB, "
              f"{CHUNK_BYTES >> 20} MiB chunks; the last one duplicates the first")

    table = Table(Column("codec", no_wrap=True, min_width=12), "dtype", "raw\nMiB", "stored\nMiB", "ratio",
                  "new\nchunks", "dedup\nhits", "put\nMB/s", "get\nMB/s", title="chunk store: every codec",
                  caption="get = read + decode + BLAKE3 check, compared bit-exactly with the source")
    summary: dict[str, Any] = {"store": store.url, "codecs": {}}
    for codec in CODECS:
        chunks = ChunkStore(store, prefix=f"{DEMO_PREFIX}/chunks", codec=CodecConfig(codec=codec))
        result = _write_all(chunks, tensors, codec)
        read_s = _read_back(chunks, tensors, result["refs"])
        summary["codecs"][codec] = result["stats"]
        first = True
        for kind, s in result["stats"].items():
            table.add_row(codec if first else "", kind, f"{s['raw'] / 2**20:.0f}", f"{s['stored'] / 2**20:.2f}",
                          f"{s['stored'] / s['raw']:.3f}", str(int(s["written"])), str(int(s["deduped"])),
                          f"{raw_total / result['seconds'] / 1e6:.0f}" if first else "",
                          f"{raw_total / read_s / 1e6:.0f}" if first else "")
            first = False
    con.print(table)

    again = _write_all(ChunkStore(store, prefix=f"{DEMO_PREFIX}/chunks"), tensors, "shuffle-zstd")
    written = sum(int(s["written"]) for s in again["stats"].values())
    deduped = sum(int(s["deduped"]) for s in again["stats"].values())
    summary["rewrite"] = {"written": written, "deduped": deduped}
    con.print(f"writing the same tensors again: {written} chunks written, {deduped} already stored "
              "(content addressing: identical bytes are stored once)")

    message = _corruption_check(store)
    summary["corruption"] = message
    con.print(f"[green]corruption detected[/green]: ChunkCorruptError: {escape(message)}")

    groups: dict[str, list[int]] = {}
    for meta in store.list(""):
        parts = meta.key.split("/")
        is_chunk = parts[-3:-2] == ["chunks"]
        top = "/".join(parts[:-2]) if is_chunk else parts[0]
        group = f"{top}/*.{parts[-1].rpartition('.')[2]}" if is_chunk else top
        g = groups.setdefault(group, [0, 0])
        g[0] += 1
        g[1] += meta.size
    listing = Table("prefix", "objects", "bytes", title=f"{escape(store.url)}: objects by prefix and codec")
    for group, (n, size) in sorted(groups.items())[:12]:
        listing.add_row(escape(group), f"{n:,}", f"{size:,}")
    if len(groups) > 12:
        listing.add_row(f"... {len(groups) - 12} more", "", "")
    con.print(listing)
    summary["objects"] = sum(n for n, _ in groups.values())
    summary["bytes"] = sum(size for _, size in groups.values())
    store.close()
    return summary


def register(app: typer.Typer) -> None:
    @app.command("demo")
    @handle_errors
    @with_store_flags
    def demo(
        store: str = typer.Option(DEFAULT_PIPELINE_STORE, "--store",
                                  help="store URL: a directory (default), file://, s3://bucket/prefix, ..."),
        size: str = typer.Option("default", "--size", help="small (tests, ~1 min) | default | large"),
        small: bool = typer.Option(False, "--small", help="same as --size small"),
        work_dir: str = typer.Option(DEFAULT_WORK, "--work-dir",
                                     help="local hot tier, ingest WAL and scratch (emptied at each run)"),
        report: str = typer.Option(DEFAULT_REPORT, "--report", help="where to write the HTML report"),
        overwrite: bool = typer.Option(False, "--overwrite",
                                       help="empty a non-empty store that a previous demo did not fill"),
        foundation: bool = typer.Option(False, "--foundation",
                                        help="run only the quick chunk/codec/dedup tour of the foundation"),
        flags: StoreFlags = StoreFlags(),
    ) -> None:
        """End-to-end training pipeline: ingest -> clean -> features -> train with checkpoints ->
        crash + resume -> corruption + fallback -> registry, retention, tiers, export; summary + HTML report."""
        opts = flags.options()
        if foundation:
            run_foundation_demo("./.demo/foundation" if store == DEFAULT_PIPELINE_STORE else store, opts)
            return
        if store.startswith("memory://"):
            raise ConfigError("the demo trains in worker processes, and a memory:// store lives in one process; "
                              "use a directory or an object store (s3://...)")
        from ..demo.pipeline import run_demo

        run_demo(store, opts, size="small" if small else size, work_dir=work_dir, report_path=report,
                 overwrite=overwrite, console=default_console)

    @app.command("report")
    @handle_errors
    @with_store_flags
    def report_cmd(
        store: str = typer.Option(DEFAULT_PIPELINE_STORE, "--store", help="the store a demo run wrote to"),
        out: str = typer.Option("demo-report.html", "--out", help="HTML file to write"),
        flags: StoreFlags = StoreFlags(),
    ) -> None:
        """Regenerate the demo's HTML report from the run record saved in a store."""
        from ..demo.report import report_from_store

        path = report_from_store(flags.open(store, read_only=True), out)
        default_console.print(f"report: {escape(path)}")
