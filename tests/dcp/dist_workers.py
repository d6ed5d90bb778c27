"""Functions run on every rank of the multi-process tests (via harness.dist.run_ranks).

Each takes (rank, world, args) inside an initialised gloo process group and returns JSON.
The expected values are built from fixed seeds, so any world size can check any shard.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.dcp import StorageReader, StorageWriter, describe_failure
from trainstore.errors import StoreError
from trainstore.store.local import LocalStore

# scenarios count chunk writes and pick deltas: keep deltas that save a few % (auto on 2 cores keeps
# only those that halve, format.delta.auto_incompressible_ratio)
SMALL = WriteOptions(chunk_bytes=4096, workers=2, pack_below=0, incompressible_ratio=0.97)


def full_tensors(seed: int = 0, bump: float = 0.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {
        "w": torch.randn(64, 40, generator=g),           # sharded on dim 0
        "v": torch.randn(24, 48, generator=g).to(torch.bfloat16),  # sharded on dim 1
        "rep": torch.randn(17, generator=g),             # replicated DTensor
        "plain": torch.arange(10, dtype=torch.int64),    # plain tensor, same on every rank
    }
    if bump:
        out["w"] = out["w"] + bump * torch.randn(64, 40, generator=g)
    return out


def make_state(world: int, seed: int = 0, bump: float = 0.0, zero: bool = False) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors(seed, bump)
    if zero:
        full = {k: torch.zeros_like(v) for k, v in full.items()}
    return {
        "model": {
            "w": distribute_tensor(full["w"], mesh, [Shard(0)]),
            "v": distribute_tensor(full["v"], mesh, [Shard(1)]),
            "rep": distribute_tensor(full["rep"], mesh, [Replicate()]),
            "plain": full["plain"],
        },
        "step": -1 if zero else 7,
        "meta": {"name": "" if zero else "run", "lrs": [0.0] if zero else [0.1, 0.2]},
    }


def check_state(state: dict, seed: int = 0, bump: float = 0.0) -> None:
    full = full_tensors(seed, bump)
    for k, expected in full.items():
        got = state["model"][k]
        got = got.full_tensor() if isinstance(got, DTensor) else got
        if not torch.equal(got, expected):
            raise AssertionError(f"tensor {k} differs after load")
    if state["step"] != 7 or state["meta"] != {"name": "run", "lrs": [0.1, 0.2]}:
        raise AssertionError(f"values differ: step={state['step']} meta={state['meta']}")


class FaultyStore(LocalStore):
    """A local store whose rank ``fail_rank`` fails (raises or SIGKILLs itself) on chunk write N.

    Chunk writes are conditional (``put_if_absent``); plain ``put`` is faulted too, so the
    injection fires whichever write path a chunk takes.
    """

    def __init__(self, root: str, rank: int, fail_rank: int, after: int, mode: str) -> None:
        super().__init__(root)
        self.armed = rank == fail_rank
        self.after, self.mode, self.puts = after, mode, 0

    def _maybe_fail(self, key: str) -> None:
        if self.armed and key.startswith("chunks/"):
            self.puts += 1
            if self.puts > self.after:
                if self.mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise StoreError(f"injected failure writing {key}")

    def put(self, key, data):  # noqa: ANN001, ANN201
        self._maybe_fail(key)
        return super().put(key, data)

    def put_if_absent(self, key, data):  # noqa: ANN001, ANN201
        self._maybe_fail(key)
        return super().put_if_absent(key, data)


def save(rank: int, world: int, args: dict) -> dict:
    state = make_state(world, args.get("seed", 0), args.get("bump", 0.0))
    w = StorageWriter(args["root"], args["job"], kind=args.get("kind", "full"), options=SMALL)
    if args.get("async"):
        dcp.async_save(state, storage_writer=w, checkpoint_id=args["step"]).result()
    else:
        dcp.save(state, storage_writer=w, checkpoint_id=args["step"])
    m = w.last_manifest
    return {"committed": m is not None, "kind": None if m is None else m.kind,
            "written": None if m is None else m.written_bytes, "logical": None if m is None else m.logical_bytes}


def load(rank: int, world: int, args: dict) -> dict:
    state = make_state(world, zero=True)
    reader = StorageReader(args["root"], args["job"], args.get("step"))
    dcp.load(state, storage_reader=reader)
    check_state(state, args.get("seed", 0), args.get("bump", 0.0))
    return {"bytes_read": reader.bytes_read, "step": reader.step}


def save_big_plain(rank: int, world: int, args: dict) -> dict:
    """One 256 KiB tensor saved whole (world 1) for the byte-range test."""
    t = torch.arange(64 * 1024, dtype=torch.float32).reshape(256, 256)
    dcp.save({"t": t}, storage_writer=StorageWriter(args["root"], args["job"], options=SMALL), checkpoint_id=1)
    return {}


def load_rows(rank: int, world: int, args: dict) -> dict:
    """Load the 256x256 tensor as a Shard(0) DTensor: each rank needs 1/world of its rows."""
    mesh = init_device_mesh("cpu", (world,))
    state = {"t": distribute_tensor(torch.zeros(256, 256), mesh, [Shard(0)])}
    reader = StorageReader(args["root"], args["job"])
    dcp.load(state, storage_reader=reader)
    if not torch.equal(state["t"].full_tensor(), torch.arange(64 * 1024, dtype=torch.float32).reshape(256, 256)):
        raise AssertionError("rows differ")
    return {"bytes_read": reader.bytes_read}


def save_faulty(rank: int, world: int, args: dict) -> dict:
    store = FaultyStore(args["root"], rank, args["fail_rank"], args["after"], args["mode"])
    state = make_state(world, seed=args.get("seed", 0))
    w = StorageWriter(store, args["job"], options=SMALL)
    try:
        dcp.save(state, storage_writer=w, checkpoint_id=args["step"])
    except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        return {"failed": True, "type": type(exc).__name__, "message": w.failure_report(exc)}
    return {"failed": False}


def barrier_ok(rank: int, world: int, args: dict) -> dict:
    dist.barrier()
    return {}


def _each(scenarios: list[tuple[str, object, dict]], rank: int, world: int) -> dict:
    """Run several scenarios in one job (process start-up costs ~10 s per rank on a busy box);
    each reports its own value or error, so one failure does not hide the others."""
    out = {}
    for name, fn, args in scenarios:
        try:
            out[name] = {"value": fn(rank, world, args)}
        except BaseException as exc:  # noqa: BLE001 - reported per scenario
            out[name] = {"error": f"{type(exc).__name__}: {describe_failure(exc)}"}
        dist.barrier()
    return out


def suite_four(rank: int, world: int, args: dict) -> dict:
    root = args["root"]
    return _each([
        ("save", save, {"root": root, "job": "j4", "step": 10}),
        ("load_rows", load_rows, {"root": root, "job": "big"}),
    ], rank, world)


def suite_two(rank: int, world: int, args: dict) -> dict:
    root = args["root"]
    scenarios = [
        ("reshard_load", load, {"root": root, "job": "j4"}),
        ("save_async_full", save, {"root": root, "job": "j2", "step": 1, "async": True}),
        ("save_incremental", save, {"root": root, "job": "j2", "step": 2, "kind": "incremental", "bump": 1e-3}),
        ("load_incremental", load, {"root": root, "job": "j2", "step": 2, "bump": 1e-3}),
        ("load_full", load, {"root": root, "job": "j2", "step": 1}),
        ("save_faulty", save_faulty, {"root": root, "job": "j2", "step": 3, "fail_rank": 1, "after": 3, "seed": 11,
                                      "mode": "raise"}),
    ]
    extra = args.get("extra_module")
    if extra:
        import importlib

        scenarios += importlib.import_module(extra).scenarios(root)
    return _each(scenarios, rank, world)

