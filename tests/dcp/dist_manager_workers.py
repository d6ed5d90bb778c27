"""CheckpointManager scenarios run inside the 2-rank job of test_dcp_storage (see suite_two)."""

from __future__ import annotations

import torch
from dist_workers import SMALL, FaultyStore, check_state, full_tensors, make_state

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.errors import BackgroundError


def manager_save_restore(rank: int, world: int, args: dict) -> dict:
    calls = []
    mgr = CheckpointManager(args["root"], "m2", CheckpointPolicy(full_every=10, incremental_every=5), options=SMALL,
                            hooks=[lambda info, m: calls.append(info.step)])
    events: list = []
    mgr.observers.append(lambda event, fields: events.append([event, fields["step"], fields.get("bytes"),
                                                               fields.get("fallbacks")])
                         if event in ("ready_copies_written", "restore_ready_copies") else None)
    h = mgr.save(10, make_state(world), metrics={"loss": 1.0})  # async: returns after the host copy
    h.wait()
    mgr.save(15, make_state(world, bump=1e-3), metrics={"loss": 0.5}, blocking=True)
    kinds = [(i.step, i.kind, i.base_step) for i in mgr.list()]
    target = make_state(world, zero=True)
    res = mgr.restore_into(target)
    check_state(target, bump=1e-3)
    full = mgr.restore(step=10)  # no target: full (unsharded) tensors on every rank
    for k, v in full_tensors().items():
        if not torch.equal(full["model"][k], v):
            raise AssertionError(f"full restore of {k} differs")
    ok = [r.ok for r in mgr.verify(15)]
    best = mgr.restore_with_info(best="loss").step
    mgr.close()
    return {"hooks": calls, "restored": res.step, "kinds": kinds, "verify": ok, "best": best,
            "blocked_s": h.blocked_s, "ready": events}


def manager_ready_fallback(rank: int, world: int, args: dict) -> dict:
    """Every restore-ready copy of step 15 corrupt (one byte flipped): each rank's restore
    falls back to base + delta for each of its pieces, bit-identical, and counts them."""
    import torch.distributed as dist

    from trainstore.store import open_store

    store = open_store(args["root"])
    if rank == 0:
        for meta in list(store.list("ready/m2/")):
            data = bytearray(store.get(meta.key))
            data[len(data) // 3] ^= 0x40
            store.put(meta.key, bytes(data))
    dist.barrier()
    mgr = CheckpointManager(store, "m2", CheckpointPolicy(full_every=10, incremental_every=5), options=SMALL)
    events: list = []
    mgr.observers.append(lambda event, fields: events.append([fields["pieces"], fields["bytes"], fields["fallbacks"]])
                         if event == "restore_ready_copies" else None)
    target = make_state(world, zero=True)
    res = mgr.restore_into(target)
    check_state(target, bump=1e-3)
    mgr.close()
    return {"restored": res.step, "events": events}


def manager_failure(rank: int, world: int, args: dict) -> dict:
    store = FaultyStore(args["root"], rank, fail_rank=1, after=2, mode="raise")
    mgr = CheckpointManager(store, "m2", CheckpointPolicy(full_every=10, incremental_every=5), options=SMALL)
    mgr.save(20, make_state(world, seed=3))
    try:
        mgr.wait()
        err = None
    except BackgroundError as exc:
        err = str(exc)
    target = make_state(world, zero=True)
    res = mgr.restore_into(target)
    check_state(target, bump=1e-3)
    mgr.close()
    return {"error": err, "restored": res.step}


def scenarios(root: str) -> list:
    return [("manager_save_restore", manager_save_restore, {"root": root}),
            ("manager_ready_fallback", manager_ready_fallback, {"root": root}),
            ("manager_failure", manager_failure, {"root": root}),
            ("manager_fsdp2", manager_fsdp2, {"root": root}),
            ("manager_corrupt", manager_corrupt, {"root": root}),
            ("manager_busy_wait", manager_busy_wait, {"root": root}),
            ("manager_handle_at_commit", manager_handle_at_commit, {"root": root}),
            ("manager_replica_share", manager_replica_share, {"root": root})]


def manager_fsdp2(rank: int, world: int, args: dict) -> dict:
    """FSDP2 (fully_shard) model + optimizer state through CheckpointManager, restored in place."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))

    def build():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        fully_shard(m, mesh=mesh)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-2)

    model, opt = build()
    x = torch.randn(4, 16)
    for _ in range(2):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    mgr = CheckpointManager(args["root"], "fsdp", options=SMALL)
    mgr.save(5, {"model": msd, "optim": osd}, blocking=True)
    expected = {k: v.full_tensor().clone() for k, v in msd.items()}
    model2, opt2 = build()  # fresh weights, no optimizer state yet
    msd2, osd2 = get_state_dict(model2, opt2)
    target = {"model": msd2, "optim": osd2}
    mgr.restore_into(target)
    set_state_dict(model2, opt2, model_state_dict=target["model"], optim_state_dict=target["optim"])
    got = get_state_dict(model2, opt2)[0]
    for k, v in expected.items():
        if not torch.equal(got[k].full_tensor(), v):
            raise AssertionError(f"FSDP2 parameter {k} differs after restore")
    out1 = model(x)
    out2 = model2(x)
    mgr.close()
    return {"same_output": bool(torch.equal(out1, out2)), "params": len(expected)}


def manager_corrupt(rank: int, world: int, args: dict) -> dict:
    """A corrupt chunk only rank 1 reads: every rank must fall back to the same older step."""
    import torch.distributed as dist

    from trainstore.checkpoint.format import manifest as mf
    from trainstore.store import open_store

    store = open_store(args["root"])
    if rank == 0:
        for meta in list(store.list("ready/m2/")):  # the restore-ready copies would serve rank 1's delta
            store.delete(meta.key)
        m = mf.load_manifest(store, "m2", 15)
        piece = next(c for c in m.tensors["model.w@32,0"].chunks if c.is_delta)  # rank 1's shard of w
        data = bytearray(store.get(piece.ref.key()))
        data[len(data) // 2] ^= 0xFF
        store.put(piece.ref.key(), bytes(data))
    dist.barrier()
    mgr = CheckpointManager(store, "m2", CheckpointPolicy(full_every=10, incremental_every=5), options=SMALL)
    target = make_state(world, zero=True)
    res = mgr.restore_into(target)
    check_state(target)  # step 10: the full checkpoint, before the bump
    mgr.close()
    return {"restored": res.step, "skipped": [s for s, _ in res.skipped], "reason": res.skipped[0][1][:300]}


def manager_busy_wait(rank: int, world: int, args: dict) -> dict:
    """on_busy="wait" with only rank 0 still busy (a slow hook after its commit) at the next
    save: no agreement collective on the training thread, and both saves commit."""
    import time

    from trainstore.dcp.backend import DcpBackend

    agreed = []
    real = DcpBackend.agree_busy
    DcpBackend.agree_busy = lambda self, busy: (agreed.append(busy), real(self, busy))[1]  # type: ignore[method-assign]
    try:
        mgr = CheckpointManager(args["root"], "busy", CheckpointPolicy(full_every=10, incremental_every=5),
                                options=SMALL, hooks=[lambda info, m: time.sleep(0.5)])
        mgr.save(10, make_state(world))
        time.sleep(0.2)  # rank 0's hook still runs: rank 0 busy, rank 1 idle
        mgr.save(15, make_state(world, bump=1e-3))
        mgr.wait()
        steps = [i.step for i in mgr.list()]
        mgr.close()
    finally:
        DcpBackend.agree_busy = real  # type: ignore[method-assign]
    return {"agreed": agreed, "steps": steps}


def manager_handle_at_commit(rank: int, world: int, args: dict) -> dict:
    """The handle of an incremental resolves on every rank when dcp.save has committed it,
    while the rank's restore-ready copies and the coordinator's hooks are still held."""
    import threading
    import time

    release = threading.Event()
    held: list = []

    def hold(*_args) -> None:  # noqa: ANN002
        held.append(time.perf_counter())
        release.wait(6.0)

    mgr = CheckpointManager(args["root"], "atcommit", CheckpointPolicy(full_every=10, incremental_every=5),
                            options=SMALL, hooks=[lambda info, m: hold() if info.step == 15 else None])
    mgr.observers.append(lambda event, fields: hold() if event == "ready_copies_written" else None)
    mgr.save(10, make_state(world), blocking=True)
    h = mgr.save(15, make_state(world, bump=1e-3))
    t0 = time.perf_counter()
    info = h.wait()
    waited = time.perf_counter() - t0
    pending = mgr.pending()
    release.set()
    mgr.wait()
    steps = [i.step for i in mgr.list()]
    mgr.close()
    return {"waited": waited, "step": info.step, "kind": info.kind, "pending": pending, "held": len(held),
            "steps": steps}


def ddp_state(seed: int = 0, zero: bool = False) -> dict:
    """A DDP-like state: plain tensors, the same on every rank (DCP writes each on one rank)."""
    g = torch.Generator().manual_seed(seed)
    sd = {"model": {f"l{i}": torch.randn(48, 32, generator=g) for i in range(6)} | {"big": torch.randn(512, 640, generator=g)},
          "optim": {f"l{i}": {"exp_avg": torch.randn(48, 32, generator=g), "step": torch.tensor(float(seed))}
                    for i in range(6)},
          "epoch": seed}
    if zero:
        sd = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()},
              "optim": {k: {n: torch.zeros_like(t) for n, t in d.items()} for k, d in sd["optim"].items()},
              "epoch": -1}
    return sd


def same_ddp(a: dict, b: dict) -> bool:
    return a["epoch"] == b["epoch"] and all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"]) and all(
        torch.equal(a["optim"][k][n], b["optim"][k][n]) for k in b["optim"] for n in b["optim"][k])


def manager_replica_share(rank: int, world: int, args: dict) -> dict:
    """Replicated tensors are staged only on the rank that writes them, from the second save
    on; a share gone stale (forced here: every rank skips one tensor) fails that save on every
    rank, naming the tensor, and the next save stages everything again."""
    from trainstore import fileio
    from trainstore.dcp.share import ReplicaShare

    bounced = []
    bounce = fileio._bounce_buffer
    fileio._bounce_buffer = lambda: (bounced.append(1), bounce())[1]  # unaligned data copied before O_DIRECT
    skipped: list = []
    from trainstore.checkpoint.save.writer import WriteOptions

    options = WriteOptions(chunk_bytes=2 << 20, workers=2, codec="raw", delta_codec="raw")  # model.big: one O_DIRECT piece
    mgr = CheckpointManager(args["root"], "share", CheckpointPolicy(full_every=2, incremental_every=1), options=options)
    mgr.observers.append(lambda event, fields: skipped.append(fields["skipped_bytes"])
                         if event == "dcp_staged_share" else None)
    sizes = []
    for step in (1, 2, 3):
        n = len(skipped)
        mgr.save(step, ddp_state(step), blocking=True)
        sizes.append(skipped[n] if len(skipped) > n else 0)
    exact = []
    for step in (1, 2, 3):
        target = ddp_state(zero=True)
        mgr.restore_into(target, step=step)
        exact.append(same_ddp(target, ddp_state(step)))
    real = ReplicaShare.skipped
    ReplicaShare.skipped = lambda self, layout, flat: frozenset({"model.l0"})  # type: ignore[method-assign]
    try:
        mgr.save(4, ddp_state(4))
        try:
            mgr.wait()
            error = None
        except BackgroundError as exc:
            error = str(exc)
    finally:
        ReplicaShare.skipped = real  # type: ignore[method-assign]
    n = len(skipped)
    mgr.save(5, ddp_state(5), blocking=True)
    target = ddp_state(zero=True)
    res = mgr.restore_into(target)
    after = {"step": res.step, "exact": same_ddp(target, ddp_state(5)), "skipped": skipped[n:]}
    mgr.close()
    fileio._bounce_buffer = bounce
    total = sum(t.numel() * t.element_size() for t in ddp_state()["model"].values()) + sum(
        t.numel() * t.element_size() for d in ddp_state()["optim"].values() for t in d.values())
    return {"skipped": sizes, "total": total, "exact": exact, "error": error, "after": after, "bounced": len(bounced)}


def two_managers_first_saves(rank: int, world: int, args: dict) -> dict:
    """Two managers of DCP jobs in one process (Lightning's same-step variant jobs have their
    own), first saves issued back to back; on rank 1 the first manager's save thread reaches
    its write late. Each backend's process groups must still be made in the same order on
    every rank (on the caller's thread), or the two jobs' collectives pair up across jobs."""
    import time

    from trainstore.dcp.backend import DcpBackend

    real = DcpBackend._write

    def late(self, step, kind, staged, metadata, committed):  # noqa: ANN001
        if rank == 1 and self.ctx.job == "first":
            time.sleep(1.0)
        return real(self, step, kind, staged, metadata, committed)

    DcpBackend._write = late  # type: ignore[method-assign]
    try:
        first = CheckpointManager(args["root"], "first", options=SMALL, backend="dcp")
        second = CheckpointManager(args["root"], "second", options=SMALL, backend="dcp")
        h1 = first.save(10, make_state(world))
        h2 = second.save(10, make_state(world, bump=1e-3))
        h1.wait()
        h2.wait()
        target = make_state(world, zero=True)
        second.restore_into(target)
        check_state(target, bump=1e-3)
        steps = [first.steps(), second.steps()]
        first.close()
        second.close()
    finally:
        DcpBackend._write = real  # type: ignore[method-assign]
    return {"steps": steps}
