"""Entry point of the ``trainstore`` CLI: one typer app, one sub-app per area.

Each area lives in its own module (``cli/store.py``, ``cli/ckpt.py``, ``cli/data.py``,
``cli/demo.py``) and exposes ``register(app)``; a missing optional dependency of one area
does not break the others. ``trainstore --version`` prints the version; ``python -m
trainstore`` runs the same app (``trainstore/__main__.py``).
"""

from __future__ import annotations

import importlib

import typer

from .. import __version__
from .common import CliGroup

app = typer.Typer(
    name="trainstore",
    cls=CliGroup,
    help="Storage for AI training pipelines: stores, checkpoints, datasets, serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

_AREAS = ("store", "ckpt", "data", "demo")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"trainstore {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print trainstore's version and exit"),
) -> None:
    """Storage for AI training pipelines: stores, checkpoints, datasets, serving."""


def _register_areas() -> None:
    for area in _AREAS:
        try:
            module = importlib.import_module(f"trainstore.cli.{area}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("trainstore.cli."):
                continue  # area not built yet
            raise
        module.register(app)


_register_areas()

if __name__ == "__main__":
    app()
