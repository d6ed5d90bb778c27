"""``trainstore ckpt restore|retain|gc|tier|register|models|alias|export|stats`` end to end."""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from trainstore import CheckpointManager, CheckpointPolicy, open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.cli.main import app

from .helpers import DAY, NOW, make_ckpt

runner = CliRunner()
SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)


def run(*args: str, code: int = 0):
    res = runner.invoke(app, ["ckpt", *args])
    assert res.exit_code == code, (res.exit_code, res.output)
    return res


def js(*args: str):
    return json.loads(run(*args, "--json").stdout)


def weights(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32)}, "step": step}


@pytest.fixture
def root(tmp_path):
    r = str(tmp_path / "s")
    with CheckpointManager(r, "run", CheckpointPolicy(full_every=2, incremental_every=1), options=SMALL) as mgr:
        for step in range(4):
            mgr.save(step, weights(step), metrics={"val_loss": 1.0 / (step + 1)}, blocking=True)
    return r


def test_restore_to_safetensors_and_stats(root, tmp_path):
    out = str(tmp_path / "r.safetensors")
    got = js("restore", root, "-j", "run", "--to", out)
    assert got["step"] == 3 and got["skipped"] == []
    t = load_file(out)
    assert torch.equal(t["model/w"], weights(3)["model"]["w"])
    got = js("restore", root, "-j", "run", "--to", out, "--best", "val_loss", "--only", "model/", "--dtype", "bf16")
    assert got["step"] == 3 and load_file(out)["w"].dtype == torch.bfloat16
    res = run("restore", root, "-j", "run", "--to", out, "--step", "9", code=2)
    assert "no checkpoint step 9" in res.output
    st = js("stats", root, "-j", "run")
    assert st["checkpoints"] == 4 and st["full"] == 2 and st["restores"] == 2 and st["recovery_success_rate"] == 1.0
    assert st["stored_bytes"] > 0 and st["missing_chunks"] == 0
    assert "recovery success rate" in run("stats", root, "-j", "run").output
    run("stats", root, "-j", "nojob", code=2)


def test_retain_dry_run_apply_and_delete_all_error(tmp_path):
    r = str(tmp_path / "old")
    store = open_store(r)
    for s in (1, 2, 3):
        make_ckpt(store, "j", s, created=NOW - 400 * DAY)
    res = run("retain", r, "-j", "j", code=2)  # the preset would delete every (400-day-old) checkpoint
    assert "would delete all 3 checkpoints" in res.output
    plan = js("retain", r, "-j", "j", "--keep-last", "1", "--dry-run")
    assert [d["step"] for d in plan["decisions"] if not d["keep"]] == [1, 2] and not plan["applied"]
    assert "would delete" in run("retain", r, "-j", "j", "--keep-last", "1", "--dry-run").output
    assert mf.list_steps(store, "j") == [1, 2, 3]
    applied = js("retain", r, "-j", "j", "--keep-last", "1")
    assert mf.list_steps(store, "j") == [3]
    assert applied["reclaimed_bytes"] == 2 * 4096  # retention freed the removed steps' chunks itself
    dry = js("gc", r, "--grace", "0", "--dry-run")
    assert dry["deleted"] == 0 and dry["bytes_reclaimed"] == 0
    assert "deleted" in run("gc", r, "--grace", "0").output
    assert js("gc", r, "--grace", "0")["deleted"] == 0
    run("retain", r, "-j", "j", "--keep-best", "loss:x", code=2)


def test_registry_alias_export_commands(root, tmp_path):
    v1 = js("register", root, "-j", "run", "-s", "1", "-m", "llm", "--dataset", "tokens@2")
    assert v1["version"] == 1 and v1["dataset"] == "tokens@2"
    js("register", root, "-j", "run", "-s", "3", "-m", "llm", "-a", "latest", "-a", "candidate")
    run("alias", root, "-m", "llm", "stable", "--promote", "1")
    run("alias", root, "-m", "llm", "stable", "--promote", "2")
    assert js("alias", root, "-m", "llm") == {"candidate": 2, "fallback": 1, "latest": 2, "stable": 2}
    assert "-> version 1" in run("alias", root, "-m", "llm", "stable", "--rollback").output
    assert js("alias", root, "-m", "llm", "stable", "--rollback", "--to", "previous")["version"]["version"] == 2
    hist = js("alias", root, "-m", "llm", "stable", "--history")
    assert [e["action"] for e in hist] == ["promote", "promote", "rollback", "rollback"]
    models = js("models", root, "-m", "llm")
    assert [v["step"] for v in models["versions"]] == [1, 3]
    assert "llm" in run("models", root).output
    out = str(tmp_path / "e.safetensors")
    exp = js("export", root, "llm@stable", "--to", out, "--only", "model/", "--dtype", "fp16")
    assert exp["step"] == 3 and exp["dtype"] == "float16"
    assert torch.equal(load_file(out)["w"], weights(3)["model"]["w"].half())
    js("export", root, "--to", out, "-j", "run", "-s", "2")
    # bad input: clear error, exit 2
    assert "no model 'nope'" in run("alias", root, "-m", "nope", code=2).output
    assert "no alias 'prod'" in run("export", root, "llm@prod", "--to", out, code=2).output
    assert "no model 'gpt'" in run("export", root, "gpt@stable", "--to", out, code=2).output
    assert "no checkpoint step 77" in run("export", root, "--to", out, "-j", "run", "-s", "77", code=2).output
    assert "no version 9" in run("alias", root, "-m", "llm", "stable", "--set", "9", code=2).output
    run("register", root, "-j", "run", "-s", "42", "-m", "llm", code=2)
    # registered checkpoints survive retention
    plan = js("retain", root, "-j", "run", "--keep-last", "1")
    assert [d["step"] for d in plan["decisions"] if d["keep"]] == [0, 1, 2, 3]  # 0, 2: bases of 1, 3


def test_tier_command(tmp_path):
    hot = str(tmp_path / "hot")
    durable = f"memory://{uuid.uuid4().hex}"
    with CheckpointManager(hot, "run", CheckpointPolicy(full_every=1, incremental_every=None), options=SMALL) as mgr:
        for step in range(3):
            mgr.save(step, weights(step), blocking=True)
    got = js("tier", hot, "-j", "run", "--durable", durable)
    assert [c["tiers"] for c in got["checkpoints"]] == ["hot"] * 3
    got = js("tier", hot, "-j", "run", "--durable", durable, "--sync", "--evict", "--keep-hot", "1")
    assert got["actions"] == {"synced": [0, 1, 2], "evicted": [0, 1]}
    assert [c["tiers"] for c in got["checkpoints"]] == ["durable", "durable", "hot/durable"]
    assert all(c["durable_s"] is not None for c in got["checkpoints"])
    assert "hot/durable" in run("tier", hot, "-j", "run", "--durable", durable).output
