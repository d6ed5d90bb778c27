"""The demo at its small setting: check what it produced, in its record and in the store."""

from __future__ import annotations

import hashlib
import os
import re

import pytest
from typer.testing import CliRunner

from trainstore import open_store
from trainstore.checkpoint import CheckpointManager
from trainstore.checkpoint.format import manifest as mf
from trainstore.demo.crash import JOB
from trainstore.demo.lifecycle_stage import MODEL
from trainstore.demo.report import PLOTS, load_run
from trainstore.demo.summary import compute_summary
from trainstore.lifecycle.registry import Registry
from trainstore.store.tiered import TieredStore

pytestmark = pytest.mark.timeout(300)


def _tiered(run) -> TieredStore:
    work = run["work"]
    return TieredStore(open_store(os.path.join(work, "hot", "checkpoints")), open_store(run["store"]),
                       open_store(os.path.join(work, "archive")))


def test_summary_numbers_sane(demo_run):
    rec = demo_run["record"]
    s = compute_summary(rec)
    dirt = rec["data"]["dirt"]
    d = s["data"]
    # cleaning removed exactly what was injected: rows missing text or label, malformed labels
    assert d["clean_rows"] == dirt["records"] - dirt["missing_text"] - dirt["missing_label"] - dirt["malformed"]
    assert d["quarantined"] == dirt["malformed"] > 0
    assert 0 < d["duplicates_removed"] <= dirt["duplicates"]
    assert d["train_rows"] + d["val_rows"] == d["clean_rows"]
    t = s["train"]
    assert t["steps"] == rec["train"]["total_steps"] > 50
    assert 0.0 <= t["wait_fraction"] < 1.0 and t["data_wait_s"] >= 0
    assert t["full"] >= 2 and t["incremental"] >= 1
    assert 0 < t["blocking_median_s"] < 30 and t["torch_save_s"] > 0 and t["torch_save_bytes"] > 0
    assert t["logical_bytes"] > t["stored_bytes"] > 0 and 0 < t["saved_fraction"] < 1
    assert t["final_val_acc"] > 0.4  # 4 classes: well above chance
    names = [n for n, _ in s["stages"]]
    assert names[:3] == ["ingest raw records", "clean (DuckDB)", "features (transform)"]
    assert all(sec > 0 for _, sec in s["stages"]) and s["total_s"] >= sum(sec for _, sec in s["stages"]) * 0.99
    out = demo_run["output"]
    for text in ("time per stage", "data-wait fraction", "plain torch.save", "bit-identical", "detected, skipped",
                 "stable"):
        assert text in out, text


def test_resumed_weights_equal_uninterrupted(demo_run):
    crash = demo_run["record"]["crash"]
    assert crash["signal"] == "SIGKILL" and crash["batch_in_epoch"] > 0  # killed mid-epoch
    assert crash["resume"]["step"] <= crash["killed_at_step"] and crash["resume"]["step"] == crash["committed_at_kill"]
    cmp = crash["compare"]
    assert cmp["identical"] and cmp["differing"] == 0 and cmp["values_compared"] > 20
    assert cmp["steps"][0] == cmp["steps"][1] == demo_run["record"]["train"]["total_steps"]


def test_corrupted_checkpoint_detected_and_skipped(demo_run):
    corr = demo_run["record"]["corruption"]
    assert corr["detected"] and corr["restore"]["step"] < corr["step"]
    assert corr["restore"]["skipped"][0][0] == corr["step"] and "Corrupt" in corr["restore"]["skipped"][0][1]
    # the store still holds it, recorded as bad (the record is written to the hot tier, where
    # the tiered store writes); restore() keeps skipping it
    assert mf.load_verify_record(_tiered(demo_run), JOB, corr["step"]).ok is False
    mgr = CheckpointManager(_tiered(demo_run), JOB)
    try:
        mgr.restore()
        assert mgr.last_restore.step != corr["step"]
        assert corr["step"] in [s for s, _ in mgr.last_restore.skipped]
    finally:
        mgr.close()


def test_registered_stable_model_and_export(demo_run):
    from safetensors.torch import load_file

    rec = demo_run["record"]["lifecycle"]
    registry = Registry(open_store(demo_run["store"]))
    stable = registry.resolve_alias(MODEL, "stable")
    assert stable.job == JOB and stable.step == rec["model"]["step"]
    assert stable.step != demo_run["record"]["corruption"]["step"]  # never the corrupted one
    exp = rec["export"]
    assert exp["matches_checkpoint"]
    tensors = load_file(exp["path"])
    assert set(tensors) == {"embed.weight", "hidden.weight", "hidden.bias", "out.weight", "out.bias"}
    with open(exp["path"], "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == exp["sha256"]
    assert open(exp["checksum_path"]).read().split()[0] == exp["sha256"]
    # independently: the export equals the registered checkpoint's model, bit for bit
    mgr = CheckpointManager(_tiered(demo_run), JOB)
    try:
        model = mgr.restore(step=stable.step)["model"]
    finally:
        mgr.close()
    for name, t in tensors.items():
        assert t.dtype == model[name].dtype and bool((t == model[name]).all()), name


def test_retention_tiers_and_storage(demo_run):
    rec = demo_run["record"]
    life = rec["lifecycle"]
    assert life["retention"]["deleted"] > 0 and life["retention"]["kept"] > 0
    kept_steps = {d["step"] for d in life["retention"]["decisions"] if d["keep"]}
    assert life["model"]["step"] in kept_steps
    store = open_store(demo_run["store"])
    durable = set(mf.list_steps(store, JOB))
    hot = set(mf.list_steps(open_store(os.path.join(demo_run["work"], "hot", "checkpoints")), JOB))
    archived = set(mf.list_steps(open_store(os.path.join(demo_run["work"], "archive")), JOB))
    assert durable | archived == kept_steps and not durable & set(life["archived"])
    assert archived == set(life["archived"])
    assert hot and hot <= durable
    tiers = dict((t, dict(parts)) for t, parts in rec["storage"]["tiers"])
    assert tiers["durable (store)"]["checkpoint chunks"] > 0 and tiers["hot (local)"]["checkpoint chunks"] > 0
    nodes = {n["id"] for n in rec["lineage"]["nodes"]}
    assert {"tickets.raw@1", "tickets.clean@1", "tickets.train@1", f"model:{MODEL}@1", "export"} <= nodes


def test_report_written_and_regenerated_from_store(demo_run, tmp_path):
    from trainstore.cli.main import app

    html = open(demo_run["report"], encoding="utf-8").read()
    for plot in PLOTS:
        svg = re.search(rf'<svg class="plot" id="{plot}".*?</svg>', html, re.S)
        assert svg and svg.group(0).count('class="mark"') >= 3, plot
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    assert load_run(open_store(demo_run["store"]))["crash"]["compare"]["identical"]
    out = tmp_path / "again.html"
    result = CliRunner().invoke(app, ["report", "--store", demo_run["store"], "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == html


def test_compare_final_detects_a_difference(tmp_path):
    """The bit-for-bit check can fail: one flipped bit in one tensor is a difference."""
    import torch

    from trainstore.demo.crash import compare_final

    class Ctx:
        store = open_store(str(tmp_path))

    w = torch.randn(1000)
    for job, t in (("a", w), ("b", w.clone())):
        with CheckpointManager(Ctx.store, job) as mgr:
            mgr.save(5, {"model": {"w": t}, "step": 5}, blocking=True)
    assert compare_final(Ctx, "a", "b")["identical"]
    bits = w.clone().view(torch.int32)
    bits[123] ^= 1
    with CheckpointManager(Ctx.store, "c") as mgr:
        mgr.save(5, {"model": {"w": bits.view(torch.float32)}, "step": 5}, blocking=True)
    res = compare_final(Ctx, "a", "c")
    assert not res["identical"] and res["differing"] == 1 and res["max_abs_diff"] > 0


def test_cli_rejects_memory_store_and_foreign_store(tmp_path):
    from trainstore.cli.main import app

    result = CliRunner().invoke(app, ["demo", "--store", "memory://x", "--small"])
    assert result.exit_code == 2 and "worker processes" in result.stderr
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep")
    result = CliRunner().invoke(app, ["demo", "--store", str(foreign), "--small", "--work-dir", str(tmp_path / "w")])
    assert result.exit_code == 2 and "not empty" in result.stderr
    assert (foreign / "precious.txt").read_text() == "keep"
    result = CliRunner().invoke(app, ["report", "--store", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "NotFoundError" in result.stderr and "empty" in result.stderr  # not created
    assert not (tmp_path / "empty").exists()
