"""The ``trainstore`` CLI skeleton: help, ``store ls``, ``store du``, ``--json``, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from trainstore import open_store
from trainstore.cli.main import app

runner = CliRunner()


@pytest.fixture
def filled(tmp_path):
    root = tmp_path / "store"
    store = open_store(str(root))
    store.put("chunks/ab/abc.zstd", b"x" * 100)
    store.put("chunks/cd/cde.raw", b"y" * 50)
    store.put("datasets/web/versions/000001.json", b"{}")
    store.put("top.txt", b"hello")
    store.put("weird[red]key", b"1")  # rich markup in a key must print literally
    return root


def test_help_via_the_installed_entry_point():
    proc = subprocess.run([sys.executable, "-m", "trainstore.cli.main", "--help"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "store" in proc.stdout and "Usage" in proc.stdout


def test_store_help():
    result = runner.invoke(app, ["store", "--help"])
    assert result.exit_code == 0
    assert "ls" in result.stdout and "du" in result.stdout


def test_ls_table(filled):
    result = runner.invoke(app, ["store", "ls", str(filled)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for key in ("chunks/ab/abc.zstd", "datasets/web/versions/000001.json", "top.txt", "weird[red]key"):
        assert key in result.stdout


def test_ls_json_and_prefix(filled):
    result = runner.invoke(app, ["store", "ls", str(filled), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["key"] for r in rows] == sorted(r["key"] for r in rows)
    assert {r["key"]: r["size"] for r in rows}["chunks/ab/abc.zstd"] == 100
    assert len(rows) == 5
    result = runner.invoke(app, ["store", "ls", f"file://{filled}", "--prefix", "chunks/", "--json"])
    assert [r["key"] for r in json.loads(result.stdout)] == ["chunks/ab/abc.zstd", "chunks/cd/cde.raw"]


def test_du_json(filled):
    result = runner.invoke(app, ["store", "du", str(filled), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["total_bytes"] == 100 + 50 + 2 + 5 + 1
    groups = {g["prefix"]: (g["bytes"], g["objects"]) for g in out["groups"]}
    assert groups["chunks"] == (150, 2)
    assert groups["datasets"] == (2, 1)
    assert groups["top.txt"] == (5, 1)
    result = runner.invoke(app, ["store", "du", str(filled), "--json", "--depth", "2"])
    groups = {g["prefix"]: g["objects"] for g in json.loads(result.stdout)["groups"]}
    assert groups["chunks/ab"] == 1 and groups["datasets/web"] == 1


def test_du_table(filled):
    result = runner.invoke(app, ["store", "du", str(filled)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "chunks" in result.stdout and "158 bytes" in result.stdout


def test_ls_and_du_on_s3(s3_url):
    url, opts = s3_url
    open_store(url, **opts).put("a/b", b"12345")
    env = {"AWS_ACCESS_KEY_ID": opts["access_key_id"], "AWS_SECRET_ACCESS_KEY": opts["secret_access_key"]}
    args = ["--endpoint", opts["endpoint"], "--region", "us-east-1", "--json"]
    result = runner.invoke(app, ["store", "ls", url, *args], env=env)
    assert result.exit_code == 0, result.output
    assert [(r["key"], r["size"]) for r in json.loads(result.stdout)] == [("a/b", 5)]
    result = runner.invoke(app, ["store", "du", url, *args], env=env)
    assert json.loads(result.stdout)["total_bytes"] == 5


@pytest.mark.parametrize("url,needle", [
    ("ftp://host/x", "unsupported store URL scheme 'ftp'"),
    ("s3:/bucket", "malformed store URL"),
])
def test_bad_url_exits_2_with_a_clear_message(url, needle):
    result = runner.invoke(app, ["store", "ls", url])
    assert result.exit_code == 2
    assert "ConfigError" in result.stderr and needle in result.stderr
    assert "Traceback" not in result.output


def test_missing_credentials_exit_2(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    result = runner.invoke(app, ["store", "du", "s3://bucket/p", "--endpoint", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "CredentialsError" in result.stderr


def test_read_only_commands_do_not_create_a_directory(tmp_path):
    missing = tmp_path / "not" / "there"
    for cmd in ("ls", "du"):
        result = runner.invoke(app, ["store", cmd, str(missing)])
        assert result.exit_code == 2
        assert "no store directory" in result.stderr
    assert not (tmp_path / "not").exists()


def test_bad_depth():
    result = runner.invoke(app, ["store", "du", "memory://x", "--depth", "0"])
    assert result.exit_code == 2  # usage error from the option's bounds
