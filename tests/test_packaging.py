"""Packaging conventions: ``python -m trainstore``, ``trainstore --version``, the torch extra a
lower bound, and optional test dependencies that skip visibly locally and fail in CI."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import trainstore

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def test_python_dash_m_and_version():
    proc = _run(sys.executable, "-m", "trainstore", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"trainstore {trainstore.__version__}"
    proc = _run(sys.executable, "-m", "trainstore", "ckpt", "--help")
    assert proc.returncode == 0 and "verify" in proc.stdout and "export" in proc.stdout


def test_torch_extra_is_a_lower_bound_and_frameworks_are_extras():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = meta["project"]["optional-dependencies"]
    assert [r for r in extras["torch"] if r.startswith("torch")] == ["torch>=2.4"]
    assert any(r.startswith("transformers") for r in extras["hf"])
    assert any(r.startswith("pytorch-lightning") for r in extras["lightning"])
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()  # the exact build only in the first install step


def test_missing_optional_dependency_skips_locally_and_fails_in_ci(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_needs_it.py").write_text(
        "from conftest import require\n"
        "require('trainstore_no_such_package', install='pip install nothing')\n"
        "def test_it():\n    pass\n")
    cmd = (sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path))
    local = _run(*cmd, env={"CI": ""}, cwd=tmp_path)
    assert local.returncode in (0, 5) and "1 skipped" in local.stdout  # 5: the only test skipped
    assert "install it with: pip install nothing" in local.stdout
    ci = _run(*cmd, env={"CI": "1"}, cwd=tmp_path)
    assert ci.returncode != 0 and "1 error" in ci.stdout and "install it with: pip install nothing" in ci.stdout
