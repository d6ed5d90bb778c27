"""Shared CLI plumbing: store options, JSON output, turning TrainstoreError into exit 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import TrainstoreError

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


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


def store_options(endpoint: str | None, region: str | None, allow_http: bool | None) -> dict:
    """open_store keyword arguments from the common CLI flags (credentials come from env)."""
    opts: dict = {}
    if endpoint:
        opts["endpoint"] = endpoint
    if region:
        opts["region"] = region
    if allow_http is not None:
        opts["allow_http"] = allow_http
    return opts
