"""One set of store options (``--endpoint``, ``--region``, ``--allow-http``) on every CLI command,
defined once (``cli.common.with_store_flags``), and reaching the store they open."""

from __future__ import annotations

import json

import numpy as np
import typer
from typer.testing import CliRunner

from trainstore.checkpoint import CheckpointManager
from trainstore.cli.main import app
from trainstore.store import open_store

STORE_OPTIONS = {"endpoint": ["--endpoint"], "region": ["--region"], "allow_http": ["--allow-http"]}


def _leaf_commands(group, prefix: str = "") -> dict:
    out = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer ships its own click)
            out.update(_leaf_commands(cmd, f"{prefix}{name} "))
        else:
            out[f"{prefix}{name}"] = cmd
    return out


def test_every_command_takes_the_same_store_options():
    commands = _leaf_commands(typer.main.get_command(app))
    assert {"store ls", "ckpt gc", "ckpt alias", "data ingest", "demo", "report"} <= set(commands)
    seen: dict[str, set[tuple]] = {name: set() for name in STORE_OPTIONS}
    for path, cmd in commands.items():
        params = {p.name: p for p in cmd.params}
        for name, opts in STORE_OPTIONS.items():
            assert name in params, f"`trainstore {path}` lacks --{name.replace('_', '-')}"
            p = params[name]
            assert p.opts == opts and p.default is None
            seen[name].add((tuple(p.opts), tuple(p.secondary_opts), p.help))
    assert all(len(v) == 1 for v in seen.values()), seen  # one definition: same flags, same help


def test_store_options_reach_the_s3_store(s3_url, monkeypatch, tmp_path):
    url, opts = s3_url
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", opts["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", opts["secret_access_key"])
    open_store(url, **opts).put("a/b.bin", b"12345")
    with CheckpointManager(open_store(url, **opts), job="j") as mgr:
        mgr.save(3, {"w": np.ones(4, dtype=np.float32)}, blocking=True)
    flags = ["--endpoint", opts["endpoint"], "--region", "us-east-1", "--allow-http"]
    runner = CliRunner()
    r = runner.invoke(app, ["store", "ls", url, "--prefix", "a/", "--json", *flags])
    assert r.exit_code == 0, r.output
    assert [(m["key"], m["size"]) for m in json.loads(r.stdout)] == [("a/b.bin", 5)]
    r = runner.invoke(app, ["ckpt", "ls", url, "--job", "j", "--json", *flags])
    assert r.exit_code == 0, r.output
    assert [i["step"] for i in json.loads(r.stdout)] == [3]
    r = runner.invoke(app, ["data", "ls", url, "--json", *flags])  # no datasets: says what the store holds
    assert r.exit_code == 2 and "NotFoundError" in r.output and "jobs/" in r.output, r.output
    r = runner.invoke(app, ["store", "ls", url, "--json", "--endpoint", opts["endpoint"], "--no-allow-http"])
    assert r.exit_code == 2 and "http" in r.output.lower()  # the flag reached the store: plain http refused
