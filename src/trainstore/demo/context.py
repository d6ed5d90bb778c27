"""What every demo stage shares: the store, local paths, the config, progress bars, timings,
and the run record (the JSON that ``report`` renders and that is saved in the store)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ..store import Store
from .config import DemoConfig, DemoPaths

RUN_KEY = "reports/demo-run.json"
RUN_FORMAT = "trainstore.demo-run/1"
HOT_KEEP_LAST = 2  # newest checkpoints kept in the hot tier (plus the bases they need)


def make_progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description:<26}"), BarColumn(bar_width=20),
                    MofNCompleteColumn(), TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
                    console=console, transient=False)


@dataclass
class RunContext:
    store: Store
    store_url: str
    store_options: dict
    config: DemoConfig
    paths: DemoPaths
    console: Console
    progress: Progress
    record: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.record.setdefault("format", RUN_FORMAT)
        self.record.setdefault("stages", [])

    @contextlib.contextmanager
    def stage(self, name: str, total: int, unit: str = "") -> Iterator[int]:
        """Time a stage and show its progress bar; yields the progress task id."""
        task = self.progress.add_task(name, total=total, note=unit)
        t0 = time.perf_counter()
        try:
            yield task
            self.progress.update(task, completed=self.progress.tasks[self._index(task)].total)
        finally:
            self.record["stages"].append({"name": name, "seconds": time.perf_counter() - t0})

    def _index(self, task: int) -> int:
        return next(i for i, t in enumerate(self.progress.tasks) if t.id == task)

    def advance(self, task: int, n: float = 1, note: str | None = None) -> None:
        if note is None:
            self.progress.advance(task, n)
        else:
            self.progress.update(task, advance=n, note=note)

    def note(self, task: int, note: str) -> None:
        self.progress.update(task, note=note)

    def tiering(self) -> Any:
        """The checkpoint tiers: hot (local dir) -> durable (the store) -> archive (local dir).

        ``archive_after=0``: the demo compresses time; in production this is e.g. ``"30d"``.
        """
        from ..lifecycle.tiering import Tiering, TierPolicy

        return Tiering(self.paths.ckpt_hot, self.store, archive=self.paths.archive,
                       policy=TierPolicy(hot_keep_last=HOT_KEEP_LAST, archive_after=0, hot_gc_grace="5s"))


__all__ = ["HOT_KEEP_LAST", "RUN_FORMAT", "RUN_KEY", "RunContext", "make_progress"]
