"""The host copy of a DCP save (``dcp/staging.py``): plain tensors in aligned arena slots,
replicated tensors another rank writes left as meta tensors, the state's structure kept.

The CUDA tests are skipped where torch sees no CUDA device (CI has none, on purpose);
``benchmarks/gpu.sh`` runs them on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

from trainstore import fileio
from trainstore.checkpoint.save.staging import Stager, plan_sizes
from trainstore.dcp.share import ReplicaShare, layout_of
from trainstore.dcp.staging import plain_sizes, stage
from trainstore.dcp.statedict import StateDictCopy
from trainstore.devicecopy import cuda_available

pytestmark = pytest.mark.timeout(120)
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device (CI has none; "
                                "benchmarks/gpu.sh runs these on a GPU machine)")


def state(device: str = "cpu") -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    return {"model": {"w": torch.randn(512, 640, device=device, generator=g),
                      "b": torch.randn(7, device=device, generator=g).to(torch.bfloat16),
                      "t": torch.randn(64, 48, device=device, generator=g).t()},  # non-contiguous
            "optim": {"state": {0: {"step": torch.tensor(3.0, device=device)}}, "param_groups": [{"lr": 0.1}]},
            "epoch": 2}


def test_plain_tensors_are_copied_into_aligned_slots_and_the_structure_is_kept():
    src = state()
    staged = stage(Stager(pin=False), src, ReplicaShare(), world=1)
    out = staged.state_dict
    assert staged.skipped_bytes == 0 and staged.arena is not None
    assert out["epoch"] == 2 and out["optim"]["param_groups"] == [{"lr": 0.1}]
    for k, v in src["model"].items():
        assert torch.equal(out["model"][k], v) and out["model"][k].data_ptr() != v.data_ptr()
    assert torch.equal(out["optim"]["state"]["0"]["step"], src["optim"]["state"][0]["step"])
    assert out["model"]["w"].data_ptr() % fileio.DIRECT_ALIGN == 0  # O_DIRECT straight from the slot
    src["model"]["w"].add_(1.0)  # training goes on: the host copy keeps the saved values
    assert not torch.equal(out["model"]["w"], src["model"]["w"])
    assert flatten_state_dict(out)[0].keys() == flatten_state_dict(src)[0].keys()  # dcp.save plans the same items


def test_replicated_tensors_another_rank_wrote_are_meta_and_not_copied():
    src = state()
    flat, _ = flatten_state_dict(src)
    share = ReplicaShare()
    share.learn(layout_of(flat, 2), frozenset({"model.b", "optim.state.0.step"}))  # rank wrote these last time
    staged = stage(Stager(pin=False), src, share, world=2)
    out = staged.state_dict
    assert out["model"]["w"].is_meta and out["model"]["t"].is_meta and out["model"]["w"].shape == (512, 640)
    assert torch.equal(out["model"]["b"], src["model"]["b"])
    assert staged.skipped_bytes == (512 * 640 + 64 * 48) * 4
    assert stage(Stager(pin=False), src, share, world=4).skipped_bytes == 0  # another world: stage all
    src["model"]["extra"] = torch.zeros(3)
    assert stage(Stager(pin=False), src, share, world=2).skipped_bytes == 0  # another layout: stage all


@pytest.mark.parametrize("template", ["state", "specs"])
def test_reserve_holds_the_first_saves_plain_tensors(template):
    src = state()
    specs = {"model": {k: (tuple(v.shape), v.dtype) for k, v in src["model"].items()},
             "optim": {"state": {0: {"step": ((), torch.float32)}}}}
    stager = Stager(pin=False)
    stager.reserve(plan_sizes(plain_sizes(src if template == "state" else specs))[1], 1, False)
    made = stager.allocations
    staged = stage(stager, src, ReplicaShare(), world=1)
    assert stager.allocations == made == 1 and not staged.arena.fresh  # copied into touched memory


@needs_cuda
def test_cuda_tensors_are_copied_on_a_side_stream_and_waited_for_on_the_save_thread():
    src = state("cuda")
    expected = {k: v.cpu() for k, v in src["model"].items()}
    torch.cuda._sleep(int(50 * 2e6))  # ~50 ms of work queued before the save
    staged = stage(Stager(), src, ReplicaShare(), world=1)
    src["model"]["w"].add_(1.0)  # queued after the copy on the training stream: not in the checkpoint
    staged.wait()
    for k, v in expected.items():
        assert torch.equal(staged.state_dict["model"][k], v)
    assert staged.arena is not None and staged.arena.pinned


def test_the_shards_host_copy_is_reused_while_the_layout_holds_and_copied_synchronously_on_the_host():
    copy = StateDictCopy(pin=False, cuda_wait="stream")
    src = {"w": torch.randn(64, 8), "n": 3, "nested": {"b": torch.randn(5)}}
    out, fence = copy.copy_async(src)
    assert fence is None  # host tensors: nothing in flight
    assert torch.equal(out["w"], src["w"]) and out["w"].data_ptr() != src["w"].data_ptr() and out["n"] == 3
    ptr = out["w"].data_ptr()
    src["w"].add_(1.0)
    out2, _ = copy.copy_async(src)
    assert out2["w"].data_ptr() == ptr and torch.equal(out2["w"], src["w"])  # same buffers, new values
    src["w"] = torch.randn(65, 8)  # the layout changed: new buffers
    out3 = copy.copy(src)
    assert out3["w"].shape == (65, 8) and torch.equal(out3["w"], src["w"])


@needs_cuda
def test_dtensor_shards_on_cuda_are_copied_on_the_side_stream_and_waited_for_on_the_save_thread(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cuda", (1,))
        w = distribute_tensor(torch.randn(2048, 1024, device="cuda"), mesh, [Shard(0)])
        src = {"model": {"w": w}, "epoch": 1}
        expected = w.to_local().cpu()
        torch.cuda._sleep(int(50 * 2e6))  # ~50 ms of work queued before the save
        staged = stage(Stager(), src, ReplicaShare(), world=1)
        assert staged.fence is not None and not staged.fence.done()  # queued behind that work; the host went on
        w.to_local().add_(1.0)  # queued after the copy on the training stream: not in the checkpoint
        staged.wait()
        out = staged.state_dict["model"]["w"]
        assert isinstance(out, DTensor) and out.to_local().device.type == "cpu" and out.to_local().is_pinned()
        assert torch.equal(out.to_local(), expected) and staged.state_dict["epoch"] == 1
    finally:
        dist.destroy_process_group()
