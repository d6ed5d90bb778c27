"""``trainstore ckpt ls|show|verify`` against a real local store."""

from __future__ import annotations

import json
import os

import torch
from typer.testing import CliRunner

from trainstore.checkpoint import CheckpointManager
from trainstore.cli.main import app


def test_ckpt_cli(tmp_path):
    root = str(tmp_path)
    with CheckpointManager(root, job="cli") as mgr:
        mgr.save(1, {"w": torch.randn(100)}, metrics={"loss": 0.5}, blocking=True)
        mgr.save(2, {"w": torch.randn(100)}, blocking=True)
        m = mgr.manifest(2)
    runner = CliRunner()
    r = runner.invoke(app, ["ckpt", "ls", root, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == ["cli"]
    r = runner.invoke(app, ["ckpt", "ls", root, "--job", "cli", "--json"])
    assert r.exit_code == 0 and [i["step"] for i in json.loads(r.stdout)] == [1, 2]
    r = runner.invoke(app, ["ckpt", "show", root, "--job", "cli", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["step"] == 2
    r = runner.invoke(app, ["ckpt", "verify", root, "--job", "cli", "--json"])
    assert r.exit_code == 0 and all(x["ok"] for x in json.loads(r.stdout))
    ref = next(iter(m.tensors.values())).chunks[0].ref
    os.unlink(os.path.join(root, ref.key()))
    r = runner.invoke(app, ["ckpt", "verify", root, "--job", "cli", "--step", "2"])
    assert r.exit_code == 1 and "BAD" in r.stdout
    r = runner.invoke(app, ["ckpt", "show", root, "--job", "nope"])
    assert r.exit_code == 2
