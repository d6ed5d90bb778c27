"""The foundation demo (``trainstore demo --foundation``; ``trainstore demo`` is the full pipeline)."""

from __future__ import annotations

import io
import uuid

from rich.console import Console
from typer.testing import CliRunner

from trainstore import open_store
from trainstore.cli.demo import run_foundation_demo
from trainstore.codecs import CODECS


def test_foundation_demo_figures(tmp_path):
    out = io.StringIO()
    summary = run_foundation_demo(str(tmp_path / "store"), console=Console(file=out, width=160))
    for codec in CODECS:
        f32 = summary["codecs"][codec]["f32"]
        assert f32["deduped"] == 4  # the tied lm_head repeats layer0's four chunks
        if codec != "raw":
            assert f32["stored"] < f32["raw"]
            assert summary["codecs"][codec]["bf16"]["stored"] < summary["codecs"][codec]["bf16"]["raw"]
    assert summary["codecs"]["shuffle-zstd"]["f32"]["stored"] < summary["codecs"]["zstd"]["f32"]["stored"]
    assert summary["rewrite"] == {"written": 0, "deduped": 13}
    assert "demo/canary/chunks/" in summary["corruption"]
    text = out.getvalue()
    assert "corruption detected" in text and "shuffle-zstd" in text
    store = open_store(str(tmp_path / "store"), create=False)
    assert sum(1 for _ in store.list("demo/chunks/")) == len(CODECS) * 9  # 9 distinct chunks per codec
    # A rerun starts from a clean demo/ prefix (real writes again) and leaves other keys alone.
    store.put("user/data", b"keep me")
    again = run_foundation_demo(str(tmp_path / "store"), console=Console(file=io.StringIO()))
    assert again["codecs"] == summary["codecs"]
    assert again["objects"] == summary["objects"] + 1
    assert store.get("user/data") == b"keep me"


def test_demo_command_on_memory_store():
    from trainstore.cli.main import app

    result = CliRunner().invoke(app, ["demo", "--foundation", "--store", f"memory://{uuid.uuid4().hex}"],
                                env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "corruption detected" in result.stdout


def test_demo_command_bad_store_url():
    from trainstore.cli.main import app

    result = CliRunner().invoke(app, ["demo", "--store", "ftp://x"])
    assert result.exit_code == 2 and "unsupported store URL scheme" in result.stderr
