"""An ``accelerate`` training loop on 2 real gloo ranks, under DDP and under FSDP2 (accelerate's
own ``fully_shard`` path, its state switched to FSDP as a GPU run builds it), checkpointing through
``AcceleratorCheckpoints``: stopped after step 6, resumed from step 4 (mid-epoch), bit-identical
to an uninterrupted run; each rank gets its own ``position`` back."""

from __future__ import annotations

from conftest import require  # tests/conftest.py: optional dependencies

require("transformers", install="pip install 'trainstore[hf]'")
require("accelerate", install="pip install 'trainstore[hf]'")

from integrations.test_hf_dist import interrupted_and_resumed, model_entries  # noqa: E402
from trainstore.checkpoint import CheckpointManager  # noqa: E402


def test_accelerate_ddp_resume_is_bit_identical(tmp_path):
    ref, resumed = interrupted_and_resumed(tmp_path, "ddp", fn="accel")
    for rank, (r, s) in enumerate(zip(ref, resumed)):
        assert s["params"] == r["params"] and s["optim"] == r["optim"] and len(r["optim"]) > 0
        assert s["sched"] == r["sched"]
        assert s["position"] == {"epoch": 0, "rank": rank}  # this rank's own, not one rank's for all
    store = f"file://{tmp_path / 'store'}"
    assert all(len(v) == 1 for v in model_entries(store, "run", 4, "models.0.").values())
    with CheckpointManager(store, "run") as mgr:
        assert mgr.manifest(4).config["trainstore_format"] == "trainstore.hf-accelerate/dcp-1"



def test_accelerate_fsdp2_resume_is_bit_identical(tmp_path):
    """The same loop with the model sharded by accelerate's FSDP2 path (``fully_shard`` over gloo)."""
    ref, resumed = interrupted_and_resumed(tmp_path, "fsdp", fn="accel")
    assert all(v["sharded"] for v in resumed)
    for r, s in zip(ref, resumed):  # this rank's shards
        assert s["params"] == r["params"] and s["optim"] == r["optim"] and len(r["optim"]) > 0
    entries = model_entries(f"file://{tmp_path / 'store'}", "run", 4, "models.0.")
    assert any(len(v) == 2 for v in entries.values())  # each rank wrote its own shard
