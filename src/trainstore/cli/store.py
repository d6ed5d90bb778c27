"""``trainstore store ls|du``: look into any store URL."""

from __future__ import annotations

from collections import defaultdict

import typer
from rich.markup import escape
from rich.table import Table

from .common import (
    CliGroup,
    JsonOpt,
    StoreFlags,
    emit_json,
    handle_errors,
    print_table,
    with_store_flags,
)

store_app = typer.Typer(help="Inspect a store (local path, file://, s3://, gs://, az://).", no_args_is_help=True,
                        cls=CliGroup)


@store_app.command("ls")
@handle_errors
@with_store_flags
def ls(
    url: str,
    prefix: str = typer.Option("", "--prefix", "-p", help="only keys starting with this"),
    json_out: bool = JsonOpt,
    flags: StoreFlags = StoreFlags(),
) -> None:
    """List the objects of a store."""
    store = flags.open(url)
    metas = sorted(store.list(prefix), key=lambda m: m.key)
    if json_out:
        emit_json([{"key": m.key, "size": m.size, "mtime": m.mtime} for m in metas])
        return
    table = Table("key", "size", title=escape(store.url))
    for m in metas:
        table.add_row(escape(m.key), f"{m.size:,}")
    print_table(table)


@store_app.command("du")
@handle_errors
@with_store_flags
def du(
    url: str,
    depth: int = typer.Option(1, "--depth", "-d", min=1, help="group keys by this many path segments"),
    json_out: bool = JsonOpt,
    flags: StoreFlags = StoreFlags(),
) -> None:
    """Bytes and object counts per top-level prefix."""
    store = flags.open(url)
    sizes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for m in store.list(""):
        group = "/".join(m.key.split("/")[:depth])
        sizes[group][0] += m.size
        sizes[group][1] += 1
    rows = sorted(sizes.items())
    total = sum(v[0] for _, v in rows)
    if json_out:
        emit_json({"url": store.url, "total_bytes": total,
                   "groups": [{"prefix": k, "bytes": v[0], "objects": v[1]} for k, v in rows]})
        return
    table = Table("prefix", "bytes", "objects", title=escape(f"{store.url}: {total:,} bytes"))
    for k, (b, n) in rows:
        table.add_row(escape(k), f"{b:,}", f"{n:,}")
    print_table(table)


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")
