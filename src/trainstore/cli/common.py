"""Shared CLI plumbing: the store options every command takes, JSON output, time formats, the
progress bar, and turning a TrainstoreError into one red line and exit status 2."""

from __future__ import annotations

import datetime
import inspect
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from ..checkpoint.format import layout
from ..errors import CredentialsError, NotFoundError, TrainstoreError
from ..store import Store, open_store

# soft_wrap: a plain line is never broken by us (a path stays one line to copy); the terminal wraps it
console = Console(soft_wrap=True)
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

JsonOpt = typer.Option(False, "--json", help="machine-readable output")
JobOpt = typer.Option(..., "--job", "-j", help="job name")


# Words a newcomer types for a command that has another name here (``inspect`` -> ``show``); a
# near-miss of a real name (``lss`` -> ``ls``) is suggested by click itself.
_SYNONYMS = {
    "inspect": "show", "info": "show", "describe": "show", "cat": "show", "list": "ls", "dir": "ls",
    "check": "verify", "validate": "verify", "fsck": "verify", "rm": "retain", "delete": "retain",
    "prune": "retain", "expire": "retain", "load": "restore", "get": "restore", "model": "models",
    "versions": "models", "tag": "alias", "promote": "alias", "stat": "stats", "metrics": "stats",
    "add": "ingest", "import": "ingest", "upload": "ingest", "history": "lineage", "collect": "gc",
    "usage": "du", "size": "du", "checkpoint": "ckpt", "checkpoints": "ckpt", "dataset": "data",
    "datasets": "data",
}


def _quiet_flags(params: list) -> list:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # typer's help would print `<bool>` after every flag
    return params


class CliGroup(TyperGroup):
    """The command groups of the CLI: an unknown command suggests the closest one (``inspect``
    -> ``show``), and flags show no ``<bool>`` type in the help."""

    def get_params(self, ctx: Any) -> list:
        return _quiet_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and not hasattr(cmd, "commands"):  # a command, not a group
            _quiet_flags(cmd.get_params(ctx))
        return cmd

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except Exception as exc:  # click's UsageError (typer vendors click): add our suggestion
            message = getattr(exc, "message", None)
            target = self._closest(ctx, args[0].lower()) if args and isinstance(message, str) else None
            if target is not None and "Did you mean" not in message:  # type: ignore[operator]
                exc.message = f"{message.rstrip('.')}. Did you mean {target!r}?"  # type: ignore[attr-defined,union-attr]
            raise

    def _closest(self, ctx: Any, word: str) -> str | None:
        """The command a synonym means, here or one group down (``inspect`` -> ``ckpt show``)."""
        target = _SYNONYMS.get(word)
        if target is None:
            return None
        if target in self.list_commands(ctx):
            return target
        for name in self.list_commands(ctx):
            sub = self.get_command(ctx, name)
            if hasattr(sub, "list_commands") and target in sub.list_commands(ctx):
                return f"{name} {target}"
        return None


def emit_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (for ``--json``)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def handle_errors(fn: F) -> F:
    """Report a TrainstoreError as one red line on stderr and exit with status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrainstoreError as exc:
            err_console.print(f"[red]error:[/red] {type(exc).__name__}: {escape(str(exc))}", highlight=False,
                              soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class StoreFlags:
    """The store options of the command line (credentials come from the environment)."""

    endpoint: str | None = None
    region: str | None = None
    allow_http: bool | None = None

    def options(self) -> dict[str, Any]:
        """``open_store`` keyword arguments: only the flags that were given."""
        given = {"endpoint": self.endpoint, "region": self.region, "allow_http": self.allow_http}
        return {k: v for k, v in given.items() if v is not None and v != ""}

    def open(self, url: str, *, create: bool = False, read_only: bool = False, **kwargs: Any) -> Store:
        """Open ``url`` with these flags. A command never creates a store unless it passes
        ``create=True`` (only commands that write new content, like ``data ingest``): a
        mistyped path is ``NotFoundError``, not a new empty directory. ``read_only`` gives a
        view that refuses every write (``ls``, ``show``, ``stats``, ``models``)."""
        try:
            store = open_store(url, **self.options(), create=create, **kwargs)
        except CredentialsError:
            if not str(url).startswith("s3://"):
                raise
            # the library's message names open_store's keyword arguments; the CLI has its own ways
            raise CredentialsError(
                f"no credentials for {url}: the CLI reads them from the environment; set AWS_ACCESS_KEY_ID "
                "and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or a profile's web "
                "identity (AWS_WEB_IDENTITY_TOKEN_FILE); --endpoint and --region choose the server") from None
        return store.with_read_only() if read_only else store


def store_contents(store: Store, limit: int = 8) -> str:
    """What a store holds, as its top-level prefixes (for a NotFoundError that says what exists)."""
    tops: set[str] = set()
    for i, meta in enumerate(store.list("")):
        head, sep, _ = meta.key.partition("/")
        tops.add(head + sep)
        if len(tops) > limit or i > 100_000:
            break
    if not tops:
        return f"{store.url} is empty"
    shown = sorted(tops)[:limit]
    return f"{store.url} holds {', '.join(shown)}{', ...' if len(tops) > limit else ''}"


def not_found(what: str, name: str, existing: list[str], store: Store, hint: str = "") -> NotFoundError:
    """``NotFoundError`` for an unknown job / model / dataset ``name``, naming those that exist."""
    if existing:
        known = ", ".join(existing[:20]) + (f" (+{len(existing) - 20} more)" if len(existing) > 20 else "")
        where = f"{what}s in {store.url}: {known}"
    else:
        where = f"no {what}s: {store_contents(store)}"
    return NotFoundError(f"no {what} {name!r} in {store.url}; {where}{hint}")


def require_job(store: Store, job: str) -> list[int]:
    """The committed steps of ``job``; ``NotFoundError`` naming the jobs that exist if none."""
    steps = layout.list_steps(store, job)
    if not steps:
        raise not_found("job", job, layout.list_jobs(store), store)
    return steps


# The one definition of the store options: ``with_store_flags`` adds them to a command.
_STORE_PARAMS = (
    inspect.Parameter("endpoint", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                      default=typer.Option(None, "--endpoint", help="S3 endpoint URL (e.g. http://127.0.0.1:9000)")),
    inspect.Parameter("region", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                      default=typer.Option(None, "--region", help="S3 region")),
    inspect.Parameter("allow_http", inspect.Parameter.KEYWORD_ONLY, annotation=bool | None,
                      default=typer.Option(None, "--allow-http/--no-allow-http", help="plain http:// endpoints are allowed by default; --no-allow-http refuses them")),
)


def with_store_flags(fn: F) -> F:
    """Give a command the shared ``--endpoint/--region/--allow-http`` options; it receives
    them as one ``flags: StoreFlags`` argument."""
    signature = inspect.signature(fn, eval_str=True)
    own = [p for name, p in signature.parameters.items() if name != "flags"]

    @wraps(fn)
    def command(*args: Any, endpoint: str | None = None, region: str | None = None,
                allow_http: bool | None = None, **kwargs: Any) -> Any:
        return fn(*args, flags=StoreFlags(endpoint, region, allow_http), **kwargs)

    command.__signature__ = signature.replace(parameters=[*own, *_STORE_PARAMS])  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in command.__signature__.parameters.values()}  # type: ignore[attr-defined]
    return command  # type: ignore[return-value]


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)


def print_table(table: Table, *, wrap: Sequence[str] = ()) -> None:
    """Print ``table`` so that no cell is ever cut: the columns named in ``wrap`` (free text:
    metrics, reasons) may wrap; every other column (paths, steps, kinds, statuses) is kept on one
    line whole. Piped (not a terminal), or when the whole columns do not fit the terminal, the
    table is printed as plain aligned columns with no borders. The title goes on its own line,
    so a store URL in it is never folded."""
    headers = [_plain(c.header) for c in table.columns]
    rows = list(zip(*([_plain(x) for x in c.cells] for c in table.columns))) if table.columns else []
    widths = [max(len(line) for r in [headers, *rows] for line in r[i].splitlines() or [""])
              for i in range(len(headers))]
    title = _plain(table.title) if table.title else None
    whole = sum(w for h, w in zip(headers, widths) if h not in wrap) + 10 * sum(h in wrap for h in headers)
    if title:
        console.print(f"[bold]{escape(title)}[/bold]", highlight=False)
        table.title = None
    if console.is_terminal and whole + 3 * len(headers) + 1 <= console.width:
        for column, header, width in zip(table.columns, headers, widths):
            if header in wrap:
                column.overflow = "fold"
            else:
                column.no_wrap, column.min_width = True, width
        console.print(table)
        return
    flat = [[c.replace("\n", " ") for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in flat) for i in range(len(headers))]
    console.print("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in flat),
                  markup=False, highlight=False)


def metrics_text(metrics: dict[str, Any], limit: int = 4) -> str:
    """``val_loss=0.3675, acc=0.91``: the first ``limit`` metrics, floats to 4 significant digits."""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(metrics.items())[:limit])


def when(t: float | None) -> str:
    """A unix time as local ISO seconds, ``-`` for none."""
    return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "-"


def secs(s: float | None) -> str:
    return "-" if s is None else f"{s:,.2f}s"


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Progress | None]:
    """A transient progress bar on stderr (stdout stays clean for --json); None when disabled."""
    if not enabled:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        yield progress
