"""Export to safetensors (bit-exact; bf16/fp16 within rounding) and Prometheus metrics."""

from __future__ import annotations

import hashlib
import urllib.request

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors import safe_open
from safetensors.torch import load_file

from trainstore import CheckpointManager, CheckpointPolicy, Registry
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ConfigError, NotFoundError
from trainstore.lifecycle.export import export_safetensors, export_version
from trainstore.lifecycle.metrics import CheckpointMetrics, load_stats

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)


def model_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"emb.weight": torch.randn(300, 64, generator=g),
                      "head.weight": torch.randn(64, 10, generator=g).to(torch.bfloat16),
                      "head.bias": torch.randn(10, generator=g, dtype=torch.float64),
                      "steps": torch.arange(7)},
            "optim": {"exp_avg": torch.randn(300, 64, generator=g)},
            "np": np.linspace(0, 1, 33, dtype=np.float32), "epoch": 3}


@pytest.fixture
def saved(tmp_path):
    root = str(tmp_path / "s")
    with CheckpointManager(root, "run", CheckpointPolicy(full_every=1, incremental_every=None), options=SMALL) as mgr:
        mgr.save(5, model_state(), metrics={"val_loss": 0.3}, blocking=True)
    return root


def test_export_bit_exact_and_checksum(saved, tmp_path):
    from trainstore import open_store

    store = open_store(saved)
    out = tmp_path / "out" / "model.safetensors"
    res = export_safetensors(store, "run", 5, out)
    loaded = load_file(str(out))
    ref = model_state()
    assert set(loaded) == {"model/emb.weight", "model/head.weight", "model/head.bias", "model/steps",
                           "optim/exp_avg", "np"}
    for name in ("emb.weight", "head.weight", "head.bias", "steps"):
        a, b = loaded[f"model/{name}"], ref["model"][name]
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert np.array_equal(loaded["np"].numpy(), ref["np"])
    line = (tmp_path / "out" / "model.safetensors.sha256").read_text()
    assert line == f"{hashlib.sha256(out.read_bytes()).hexdigest()}  model.safetensors\n" == f"{res.sha256}  model.safetensors\n"
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["trainstore.step"] == "5" and len(f.metadata()["trainstore.checkpoint_id"]) == 64


@pytest.mark.parametrize("dtype,torch_dtype,rtol", [("bf16", torch.bfloat16, 2 ** -8), ("fp16", torch.float16, 2 ** -11)])
def test_export_cast_only_model(saved, tmp_path, dtype, torch_dtype, rtol):
    from trainstore import open_store

    out = tmp_path / f"m-{dtype}.safetensors"
    export_safetensors(open_store(saved), "run", 5, out, dtype=dtype, only="model/")
    loaded = load_file(str(out))
    ref = model_state()["model"]
    assert set(loaded) == set(ref)
    assert loaded["steps"].dtype == torch.int64 and torch.equal(loaded["steps"], ref["steps"])  # ints untouched
    for name in ("emb.weight", "head.bias"):
        assert loaded[name].dtype == torch_dtype
        assert torch.equal(loaded[name], ref[name].to(torch_dtype))  # exactly the rounded value
        assert torch.allclose(loaded[name].double(), ref[name].double(), rtol=rtol, atol=1e-6)


def test_export_errors_and_registered_version(saved, tmp_path):
    from trainstore import open_store

    store = open_store(saved)
    with pytest.raises(NotFoundError, match="no checkpoint step 6"):
        export_safetensors(store, "run", 6, tmp_path / "x.safetensors")
    with pytest.raises(ConfigError, match="dtype"):
        export_safetensors(store, "run", 5, tmp_path / "x.safetensors", dtype="int8")
    with pytest.raises(ConfigError, match="nothing to export"):
        export_safetensors(store, "run", 5, tmp_path / "x.safetensors", only="nope/")
    reg = Registry(store)
    reg.register("run", 5, "llm", aliases=("stable",))
    res = export_version(reg, "llm@stable", tmp_path / "v.safetensors", only="model/")
    with safe_open(res.path, "pt") as f:
        assert f.metadata()["trainstore.model_version"] == "llm@1"
    with pytest.raises(NotFoundError, match="no alias 'prod'"):
        export_version(reg, "llm@prod", tmp_path / "v.safetensors")


def test_metrics_endpoint_and_persisted_stats(tmp_path):
    from trainstore import open_store

    root = str(tmp_path / "s")
    store = open_store(root)
    metrics = CheckpointMetrics(store=store)
    with CheckpointManager(store, "run", CheckpointPolicy(full_every=2, incremental_every=1), options=SMALL,
                           observers=[metrics.observe]) as mgr:
        for step in range(4):
            mgr.save(step, model_state(0), blocking=True)
        mgr.restore()
        mgr.verify(deep=False)
    port = metrics.serve(0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        metrics.stop()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    saves = {s.labels["kind"]: s.value for s in fams["trainstore_ckpt_saves"].samples if s.name.endswith("_total")}
    assert saves == {"full": 2.0, "incremental": 2.0}
    assert any(s.value == 4 for s in fams["trainstore_ckpt_blocking_seconds"].samples if s.name.endswith("_count"))
    restores = {s.labels["outcome"]: s.value for s in fams["trainstore_ckpt_restores"].samples if s.name.endswith("_total")}
    assert restores == {"ok": 1.0}
    ratio = [s.value for s in fams["trainstore_ckpt_dedup_ratio"].samples][0]
    assert 0.9 <= ratio <= 1.0  # the same state again: nearly everything deduplicated
    stored = {s.labels["kind"]: s.value for s in fams["trainstore_ckpt_bytes"].samples if s.name.endswith("_total")}
    assert stored["logical"] > 0 and stored["written"] < stored["logical"]
    stats = load_stats(store, "run")
    assert stats["saves"] == 4 and stats["restores"] == 1 and stats["restores_ok"] == 1 and stats["processes"] == 1
    assert stats["verifications"] == 4 and stats["verify_failures"] == 0
