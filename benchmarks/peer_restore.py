"""Peer tier (issue 27): restore after one lost node from peers vs from the durable tier (moto S3),
bytes stored and sent per checkpoint for replicas=1 and (4, 2) parity, and erasure-coding
throughput per core (zfec, which trainstore uses; pyeclib's backends next to it when installed).

    .venv/bin/python benchmarks/peer_restore.py                 # 4 nodes replicas=1, 6 nodes (4,2)
    .venv/bin/python benchmarks/peer_restore.py --quick         # smoke run (tiny)
    .venv/bin/python benchmarks/peer_restore.py --mb 64 --repeats 3 --out bench-out/peer_restore.json

Each "node" is one gloo rank on this machine with its own hot and peer directory; the durable
tier is an S3 bucket on a moto server on 127.0.0.1. A save of ``--mb`` MiB per node is
protected by the peers; node 1's directories are deleted (a new, empty host); the job restarts
and restores (a) through the peer tier, (b) through the plain manager, which reads node 1's
chunks from S3. Times are node 1's (recovery + load) and the slowest node's; medians of
``--repeats``. The model of docs/checkpoints.md ("Peer tier") takes its rates from here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the test harness: harness.dist

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.checkpoint.save.writer import WriteOptions  # noqa: E402
from trainstore.peer import PeerPolicy, PeerTier  # noqa: E402
from trainstore.store import LocalStore, TieredStore, open_store  # noqa: E402

OPTIONS = WriteOptions(chunk_bytes=1 << 20, workers=2, pack_below=0)


def _stores(args: dict, rank: int) -> TieredStore:
    durable = open_store(args["url"], **args["options"])
    return TieredStore(LocalStore(os.path.join(args["root"], f"hot{rank}")), durable)


def _state(rank: int, mb: float, step: int = 10) -> dict:
    """The node's state at ``step``: step 20 changed the first tenth of it (an incremental)."""
    g = torch.Generator().manual_seed(rank + 1)
    n = int(mb * (1 << 20)) // 4
    w = torch.randn(n, generator=g)
    if step >= 20:
        w[: n // 10] += 1.0
    return {"model": {f"w{rank}": w}}


def bench_save(rank: int, world: int, args: dict) -> dict:
    """Step 10 (full), then at once step 20 (incremental, a tenth of the state changed) while
    step 10's protection runs: step 20's ``blocked_s`` is the training stall protection adds
    (compared with the same two saves without a peer tier: ``policy`` None)."""
    store = _stores(args, rank)
    peer = None
    if args["policy"] is not None:
        peer = PeerTier(store, "b", PeerPolicy(**args["policy"]), os.path.join(args["root"], f"peer{rank}"),
                        node=rank)
    mgr = CheckpointManager(store, "b", CheckpointPolicy(), options=OPTIONS)
    if peer is not None:
        peer.attach(mgr)
    state = _state(rank, args["mb"])
    t0 = time.perf_counter()
    h = mgr.save(10, state, kind="full")
    h.wait()
    committed = time.perf_counter() - t0
    h2 = mgr.save(20, _state(rank, args["mb"], 20), kind="incremental")  # while step 10 is being protected
    h2.wait()
    if peer is not None:
        peer.wait()
    protected = time.perf_counter() - t0
    mgr.close()
    if peer is None:
        return {"blocked_s": h.blocked_s, "blocked2_s": h2.blocked_s, "committed_s": committed}
    peer.close()
    st = peer.stats[0]
    return {"blocked_s": h.blocked_s, "blocked2_s": h2.blocked_s, "committed_s": committed,
            "protected_s": protected, "own_bytes": st.own_bytes, "sent_bytes": st.sent_bytes,
            "stored_bytes": st.stored_bytes, "protected": st.protected,
            "sent2_bytes": peer.stats[1].sent_bytes, "new2_bytes": peer.stats[1].new_bytes}


def bench_restore(rank: int, world: int, args: dict) -> dict:
    store = _stores(args, rank)
    target = _state(rank, args["mb"])
    for v in target["model"].values():
        v.zero_()
    peer = PeerTier(store, "b", PeerPolicy(**args["policy"]), os.path.join(args["root"], f"peer{rank}"), node=rank)
    mgr = CheckpointManager(store, "b", CheckpointPolicy(), options=OPTIONS)
    torch.distributed.barrier()
    t0 = time.perf_counter()
    phases: dict = {}
    if args["mode"] == "peer":
        res, report = peer.restore_into(mgr, target)
        sources = report.bytes
        phases = {**report.phases, "recover_s": report.seconds}
    else:
        res, sources = mgr.restore_into(target), {}
    seconds = time.perf_counter() - t0
    phases["load_s"] = seconds - phases.get("recover_s", 0.0)
    same = torch.equal(target["model"][f"w{rank}"], _state(rank, args["mb"], res.step)["model"][f"w{rank}"])
    mgr.close()
    peer.close()
    return {"seconds": seconds, "step": res.step, "same": same, "sources": sources, "phases": phases}


def codec_rates(mb: float, k: int = 4, m: int = 2) -> list[dict]:
    """Encode (data bytes in) and decode (m blocks lost) MB/s on one core."""
    import zfec

    blk = int(mb * (1 << 20)) // k
    blocks = tuple(os.urandom(blk) for _ in range(k))
    rows = []
    t = time.perf_counter()
    par = zfec.Encoder(k, k + m).encode(blocks, tuple(range(k, k + m)))
    enc = k * blk / (time.perf_counter() - t) / 1e6
    t = time.perf_counter()
    out = zfec.Decoder(k, k + m).decode((*blocks[m:], *par), tuple(range(m, k + m)))
    dec = k * blk / (time.perf_counter() - t) / 1e6
    assert bytes(out[0]) == blocks[0]
    rows.append({"library": "zfec", "encode_MBps": enc, "decode_MBps": dec})
    try:
        from pyeclib.ec_iface import ECDriver
    except ImportError:
        return rows
    data = b"".join(blocks)
    for ec in ("isa_l_rs_vand", "liberasurecode_rs_vand"):
        try:
            d = ECDriver(k=k, m=m, ec_type=ec)
        except Exception:  # noqa: BLE001 - a backend this build lacks
            continue
        t = time.perf_counter()
        frags = d.encode(data)
        enc = len(data) / (time.perf_counter() - t) / 1e6
        t = time.perf_counter()
        assert d.decode(frags[m:]) == data
        dec = len(data) / (time.perf_counter() - t) / 1e6
        rows.append({"library": f"pyeclib {ec}", "encode_MBps": enc, "decode_MBps": dec})
    return rows


def main() -> None:
    from harness.dist import run_ranks

    from trainstore.testing.s3server import start_s3_server

    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=float, default=16.0, help="MiB of state per node")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.quick:
        a.mb, a.repeats = 0.5, 1
    out: dict = {"mb_per_node": a.mb, "codec": codec_rates(max(a.mb, 1.0) * 4), "settings": []}
    for r in out["codec"]:
        print(f"{r['library']:>32}: encode {r['encode_MBps']:7.0f} MB/s, decode {r['decode_MBps']:7.0f} MB/s (one core)")
    server = start_s3_server()
    try:
        for name, world, policy in (("replicas=1", 4, {"replicas": 1}), ("data=4,parity=2", 6, {"data": 4, "parity": 2})):
            runs: dict[str, list] = {"peer": [], "durable": []}
            saves = []
            for rep in range(a.repeats):
                bucket = f"peer-bench-{world}-{rep}"
                server.create_bucket(bucket)
                with tempfile.TemporaryDirectory() as root:
                    args = {"url": f"s3://{bucket}/ckpt", "options": server.options(), "root": root,
                            "policy": policy, "mb": a.mb}
                    res = run_ranks("peer_restore:bench_save", world, args, pythonpath=[HERE], timeout_s=900)
                    bad = [(r.rank, r.error, r.stderr[-600:]) for r in res if not r.ok]
                    assert not bad, bad
                    saves.append([r.value for r in res])
                    snapshot = os.path.join(root, "snapshot")
                    os.makedirs(snapshot)
                    for d in (f"hot{1}", f"peer{1}"):
                        shutil.copytree(os.path.join(root, d), os.path.join(snapshot, d))
                    for mode in ("peer", "durable"):
                        for d in (f"hot{1}", f"peer{1}"):  # node 1 comes back empty
                            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
                        res = run_ranks("peer_restore:bench_restore", world, {**args, "mode": mode},
                                        pythonpath=[HERE], timeout_s=900)
                        bad = [(r.rank, r.error, r.stderr[-600:]) for r in res if not r.ok]
                        assert not bad, bad
                        assert all(r.value["same"] for r in res)
                        runs[mode].append({"lost": res[1].value["seconds"], "slowest": max(r.value["seconds"] for r in res),
                                           "sources": res[1].value["sources"], "phases": res[1].value["phases"],
                                           "survivor_inventory_s": max(r.value["phases"].get("inventory_s", 0.0)
                                                                       for r in res)})
                        for d in (f"hot{1}", f"peer{1}"):  # the same starting point for the next mode
                            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
                            shutil.copytree(os.path.join(snapshot, d), os.path.join(root, d))
            bucket = f"peer-bench-{world}-none"
            server.create_bucket(bucket)
            with tempfile.TemporaryDirectory() as root:  # the same saves without a peer tier
                args = {"url": f"s3://{bucket}/ckpt", "options": server.options(), "root": root, "policy": None,
                        "mb": a.mb}
                res = run_ranks("peer_restore:bench_save", world, args, pythonpath=[HERE], timeout_s=900)
                assert all(r.ok for r in res), [(r.rank, r.error) for r in res if not r.ok]
                plain = [r.value for r in res]
            s0 = saves[-1]
            row = {"setting": name, "nodes": world,
                   "own_bytes_per_node": statistics.mean(v["own_bytes"] for v in s0),
                   "sent_bytes_per_node": statistics.mean(v["sent_bytes"] for v in s0),
                   "stored_bytes_per_node": statistics.mean(v["stored_bytes"] for v in s0),
                   "blocked_s": statistics.median(v["blocked_s"] for s in saves for v in s),
                   "blocked_during_protection_s": statistics.median(v["blocked2_s"] for s in saves for v in s),
                   "blocked_without_peer_s": statistics.median(v["blocked2_s"] for v in plain),
                   "incremental_sent_vs_new": statistics.mean(v["sent2_bytes"] / max(v["new2_bytes"], 1) for v in s0),
                   "committed_s": statistics.median(max(v["committed_s"] for v in s) for s in saves),
                   "protected_s": statistics.median(max(v["protected_s"] for v in s) for s in saves),
                   "restore_peer_lost_s": statistics.median(r["lost"] for r in runs["peer"]),
                   "restore_durable_lost_s": statistics.median(r["lost"] for r in runs["durable"]),
                   "restore_peer_slowest_s": statistics.median(r["slowest"] for r in runs["peer"]),
                   "restore_durable_slowest_s": statistics.median(r["slowest"] for r in runs["durable"]),
                   "peer_sources_lost_node": runs["peer"][-1]["sources"],
                   "peer_phases_lost_node": {k: statistics.median(r["phases"].get(k, 0.0) for r in runs["peer"])
                                             for k in runs["peer"][-1]["phases"]},
                   "peer_slowest_inventory_s": statistics.median(r["survivor_inventory_s"] for r in runs["peer"])}
            row["peer_vs_durable"] = row["restore_peer_lost_s"] / row["restore_durable_lost_s"]
            out["settings"].append(row)
            print(f"{name} ({world} nodes, {a.mb} MiB/node): stored {row['stored_bytes_per_node'] / row['own_bytes_per_node']:.2f}x, "
                  f"sent {row['sent_bytes_per_node'] / row['own_bytes_per_node']:.2f}x of a node's bytes; "
                  f"save blocked {row['blocked_s'] * 1e3:.0f} ms; next save blocked {row['blocked_during_protection_s'] * 1e3:.0f} ms "
                  f"during protection vs {row['blocked_without_peer_s'] * 1e3:.0f} ms without a peer tier; incremental sent "
                  f"{row['incremental_sent_vs_new']:.2f}x its new bytes; committed {row['committed_s']:.2f} s, "
                  f"protected {row['protected_s']:.2f} s; restore of the lost node: peers {row['restore_peer_lost_s']:.2f} s "
                  f"vs durable {row['restore_durable_lost_s']:.2f} s ({row['peer_vs_durable']:.2f}x); "
                  f"sources {row['peer_sources_lost_node']}; lost node's peer phases (s) "
                  f"{ {k: round(v, 3) for k, v in row['peer_phases_lost_node'].items()} }, slowest node's inventory "
                  f"{row['peer_slowest_inventory_s']:.3f} s")
    finally:
        server.stop()
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
