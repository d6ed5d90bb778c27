"""The ``trainstore ckpt`` group: one typer app made of the commands of ``ckpt_inspect``
(ls, show, verify), ``ckpt_lifecycle`` (restore, retain, gc, tier, stats) and ``ckpt_models``
(register, models, alias, export)."""

from __future__ import annotations

import typer

from . import ckpt_inspect, ckpt_lifecycle, ckpt_models
from .common import CliGroup

ckpt_app = typer.Typer(help="Checkpoints: list, show, verify, restore, retain, collect garbage, tier, "
                            "register and export the checkpoints of a job.", no_args_is_help=True,
                       cls=CliGroup)
for _part in (ckpt_inspect, ckpt_lifecycle, ckpt_models):
    ckpt_app.add_typer(_part.commands)


def register(app: typer.Typer) -> None:
    app.add_typer(ckpt_app, name="ckpt")
