"""Hugging Face ``Trainer`` on real gloo ranks (DDP and FSDP2) checkpointing through trainstore.

Each case trains a tiny GPT-2 on 2 ranks: once uninterrupted (reference), once stopped after
step 6 (checkpoints at 4, 8, ... through the ``dcp`` backend), then resumed from the newest
checkpoint (step 4, mid-epoch) to the end. Parameters and optimizer state of every rank must
equal the reference's bit for bit, and so must the logged losses (the restored log history
and the steps after it); the DDP case also has a frozen parameter (not in the optimizer), as
transformers' own resume tests do. The manifests prove who wrote what: under DDP every
model tensor once (not once per rank), under FSDP2 each rank's shards; every rank's RNG under
its own key. FSDP2 checkpoints are then resumed on 1 and on 3 ranks (resharded).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import require  # tests/conftest.py: optional dependencies

require("transformers", install="pip install 'trainstore[hf]'")
require("accelerate", install="pip install 'trainstore[hf]'")

from harness.dist import run_ranks  # noqa: E402

from trainstore.checkpoint import CheckpointManager  # noqa: E402

HERE = str(Path(__file__).parent)
W = "hf_dist_worker"


def train(tmp: Path, name: str, world: int = 2, fn: str = "trainer", **args) -> list[dict]:
    a = {"store": f"file://{tmp / 'store'}", "job": args.pop("job", name), "root": str(tmp / name),
         "out": str(tmp / name), **args}
    res = run_ranks(f"{W}:{fn}", world=world, args=a, timeout_s=240, pg_timeout_s=60,
                    pythonpath=[HERE])
    assert all(r.ok for r in res), [(r.rank, r.error, r.stderr[-2500:]) for r in res]
    return [r.value for r in res]


def interrupted_and_resumed(tmp: Path, mode: str, fn: str = "trainer", **kw) -> tuple[list[dict], list[dict]]:
    ref = train(tmp, "ref", mode=mode, fn=fn, **kw)
    stopped = train(tmp, "stopped", job="run", mode=mode, stop_at=6, fn=fn, **kw)
    assert [v["step"] for v in stopped] == [6, 6]
    resumed = train(tmp, "resumed", job="run", mode=mode, resume=True, fn=fn, **kw)
    assert [v["restored"] for v in resumed] == [4, 4]  # mid-epoch (6 steps per epoch on 2 ranks)
    assert [v["step"] for v in resumed] == [v["step"] for v in ref] == [12, 12]
    return ref, resumed


def model_entries(store: str, job: str, step: int, prefix: str = "model.") -> dict[str, list[str]]:
    """fqn -> the shard names (``model.<fqn>@<offsets>``) the manifest of ``step`` holds."""
    with CheckpointManager(store, job) as mgr:
        names = list(mgr.manifest(step).tensors)
    out: dict[str, list[str]] = {}
    for n in names:
        if n.startswith(prefix):
            out.setdefault(n.split("@")[0], []).append(n)
    return out


def test_trainer_ddp_resume_is_bit_identical_and_the_model_is_written_once(tmp_path):
    ref, resumed = interrupted_and_resumed(tmp_path, "ddp", freeze=True)
    for r, s in zip(ref, resumed):
        assert s["params"] == r["params"] and s["optim"] == r["optim"] and len(r["optim"]) > 0
        assert s["sched"] == r["sched"]
        assert s["losses"] == r["losses"]  # the restored log history, and the same losses after it
    assert not resumed[0]["sharded"]
    store = f"file://{tmp_path / 'store'}"
    entries = model_entries(store, "run", 4)
    assert entries and all(len(v) == 1 for v in entries.values())  # one copy across the 2 ranks
    with CheckpointManager(store, "run") as mgr:
        m = mgr.manifest(4)
        model_bytes = sum(e.nbytes for n, e in m.tensors.items() if n.startswith("model."))
        whole = mgr.restore(4)
        assert model_bytes == sum(t.numel() * t.element_size() for t in whole["model"].values())
        assert sorted(whole["ranks"]) == ["rank0", "rank1"]  # each rank's RNG under its own key
        assert m.config["trainstore_format"] == "trainstore.hf-trainer/dcp-1"


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    ref, resumed = interrupted_and_resumed(tmp, "fsdp")
    return tmp, ref, resumed


def test_trainer_fsdp2_resume_matches_an_uninterrupted_run(fsdp_run):
    tmp, ref, resumed = fsdp_run
    assert all(v["sharded"] for v in resumed)
    for rank, (r, s) in enumerate(zip(ref, resumed)):
        assert s["params"].keys() == r["params"].keys() and len(r["optim"]) > 0
        a = torch.load(f"{tmp / 'ref'}.rank{rank}.pt", weights_only=True)
        b = torch.load(f"{tmp / 'resumed'}.rank{rank}.pt", weights_only=True)
        for k in a["params"]:  # bit-identical: gloo's reduce-scatter sums in a fixed order
            assert torch.equal(a["params"][k], b["params"][k]), k
        for k in a["optim"]:
            assert torch.equal(a["optim"][k], b["optim"][k]), k
        assert s["losses"] == r["losses"]
    entries = model_entries(f"file://{tmp / 'store'}", "run", 4)
    sharded = [v for v in entries.values() if len(v) == 2]
    assert sharded, entries  # each rank wrote its own row shard of the sharded parameters
    assert all(sorted(v)[0].endswith("@0") or "@0," in sorted(v)[0] for v in sharded)


@pytest.mark.parametrize("world", [1, 3])
def test_trainer_fsdp2_checkpoint_resumes_on_another_world_size(fsdp_run, world):
    tmp, _, _ = fsdp_run
    store = f"file://{tmp / 'store'}"
    with CheckpointManager(store, "run") as mgr:
        newest = mgr.steps()[-1]
        saved = mgr.restore(newest)["model"]  # whole tensors as saved on 2 ranks
    out = train(tmp, f"w{world}", world=world, job="run", mode="fsdp", resume=True, stop_at=newest + 1,
                limit=None)
    assert all(v["restored"] == newest for v in out)
    for rank in range(world):
        begin = torch.load(f"{tmp / f'w{world}'}.rank{rank}.pt", weights_only=True)["begin"]
        for k, t in saved.items():
            assert torch.equal(begin[k], t), f"rank {rank}: {k} not resharded exactly"
    notes = [v["last_restore"] for v in out]
    assert all("saved by 2 rank(s), resumed on " + str(world) in n for n in notes), notes
    if world == 3:
        assert "rank 2 has no saved per-rank state" in notes[2]
    else:
        assert "ranks 1..1 is not used" in notes[0]
