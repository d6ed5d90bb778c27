"""One small demo run shared by the demo tests (it takes most of their time)."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """``run_demo`` at the small size on a local directory store; (record, dirs, console text)."""
    from trainstore.demo.pipeline import run_demo

    root = tmp_path_factory.mktemp("demo")
    out = io.StringIO()
    record = run_demo(str(root / "store"), size="small", work_dir=str(root / "work"),
                      report_path=str(root / "report.html"), console=Console(file=out, width=160))
    return {"record": record, "root": root, "store": str(root / "store"), "work": str(root / "work"),
            "report": str(root / "report.html"), "output": out.getvalue()}


def chromium_path() -> str | None:
    for path in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.access(path, os.X_OK):
            return path
    return None
