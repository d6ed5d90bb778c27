"""Node loss (issue 27): checkpoints protected by peer nodes (replicas or zfec parity), restored
after nodes come back empty, with the durable tier read only for what peers cannot rebuild.

Real gloo ranks on 127.0.0.1, one per "node" (explicit node index), each with its own hot and
peer directory; one durable directory whose reads the ranks count. A node is lost by deleting
its directories between the saving job and the restarted one (a new, empty host), or by
SIGKILL in the middle of a transfer."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil

import pytest
from harness.dist import run_ranks

from trainstore.errors import ConfigError, DistributedError, IntegrityError
from trainstore.peer import PeerPolicy
from trainstore.peer.erasure import (
    block_len,
    decode_stripe,
    encode_parity,
    slice_span,
    stripe_node,
    stripe_of,
)
from trainstore.peer.pieces import Record
from trainstore.peer.transport import frame, unframe

HERE = os.path.dirname(__file__)
ENV = {"TRAINSTORE_CKPT_TIMEOUT_S": "8"}


def _run(fn: str, world: int, args: dict, timeout_s: float = 240.0):
    return run_ranks(f"peer_workers:{fn}", world, args, pythonpath=[HERE], timeout_s=timeout_s, pg_timeout_s=20,
                     env=ENV)


def _ok(results) -> list:
    bad = [(r.rank, r.returncode, r.error, r.stderr[-1500:]) for r in results if not r.ok]
    assert not bad, bad
    return [r.value for r in results]


def _lose(root, *nodes: int) -> None:
    for n in nodes:
        shutil.rmtree(os.path.join(root, f"hot{n}"), ignore_errors=True)
        shutil.rmtree(os.path.join(root, f"peer{n}"), ignore_errors=True)


def _save(root, world: int, policy: dict, steps=(10, 20)) -> list:
    return _ok(_run("save", world, {"root": str(root), "policy": policy, "steps": list(steps)}))


def test_bad_settings_name_the_numbers():
    with pytest.raises(ConfigError, match="replicas=3.*more than 3 nodes.*has 3"):
        PeerPolicy(replicas=3).check_nodes(3)
    with pytest.raises(ConfigError, match="group of 6 nodes is larger than the job's 4"):
        PeerPolicy(data=4, parity=2).check_nodes(4)
    with pytest.raises(ConfigError, match="groups of 3 nodes do not divide the job's 4"):
        PeerPolicy(data=2, parity=1).check_nodes(4)
    with pytest.raises(ConfigError, match="not both or neither"):
        PeerPolicy(replicas=1, data=4, parity=2)
    with pytest.raises(ConfigError, match="data >= 1 and parity >= 1"):
        PeerPolicy(data=4)
    PeerPolicy(data=4, parity=2).check_nodes(12)  # two groups


@pytest.mark.parametrize("k,m", [(4, 2), (2, 1), (3, 3)])
def test_stripes_rebuild_any_m_lost_nodes(k, m):
    """The stripe layout (no processes): every node's bundle comes back from any k blocks of
    each of its stripes, for every choice of m lost positions."""
    g, rng = k + m, random.Random(k * 10 + m)
    bundles = [rng.randbytes(rng.randint(0, 300)) for _ in range(g)]

    def data_slice(pos: int, t: int) -> bytes:
        a, n = slice_span(len(bundles[pos]), k, t)
        return bundles[pos][a:a + n]

    parity = {}
    for s in range(g):
        parts = [data_slice(stripe_node(s, t, g), t) for t in range(k)]
        for j, b in zip(range(k, g), encode_parity(parts, k, g, list(range(k, g))), strict=True):
            parity[(s, j)] = b
    for lost in itertools.combinations(range(g), m):
        for L in lost:
            got = b""
            for t in range(k):
                s = stripe_of(L, t, g)
                lens = [len(data_slice(stripe_node(s, j, g), j)) for j in range(k)]
                n = block_len(lens)
                blocks = {j: (data_slice(stripe_node(s, j, g), j).ljust(n, b"\0") if j < k else parity[(s, j)])
                          for j in range(g) if stripe_node(s, j, g) not in lost}
                got += decode_stripe(blocks, k, g, lens)[t]
            assert got == bundles[L], (lost, L)
    with pytest.raises(IntegrityError, match=f"needs {k} of its {g} blocks"):
        decode_stripe({0: b"x"}, k, g, [1] * k)


def test_malformed_peer_input_is_refused():
    assert unframe(memoryview(frame([("a", b"12"), ("b", b"")]))) == [("a", b"12"), ("b", b"")]
    with pytest.raises(DistributedError, match="malformed frame"):
        unframe(memoryview(b"\xff" * 12))
    with pytest.raises(DistributedError, match="names"):
        unframe(memoryview(frame([("a", b"12")]) + b"extra"))
    with pytest.raises(IntegrityError, match="peer record x is malformed"):
        Record.from_bytes(b'{"owner": 1}', "x")
    with pytest.raises(IntegrityError, match="negative size"):
        Record.from_bytes(b'{"owner": 1, "step": 2, "keys": {"k": -1}, "bundle": []}', "x")


def test_lose_one_node_replicas(tmp_path):
    saved = _save(tmp_path, 4, {"replicas": 1})
    for v in saved:
        assert v["protected"] == [10, 20] and v["failures"] == 0
        assert [s[0] for s in v["list"] if s[1]] == [10, 20]
        (_, _, own10, new10, _, stored10), (_, _, own20, new20, _, _) = v["stats"]
        assert new10 == own10 > 0 and stored10 > 0
        assert 0 < new20 < own20  # the incremental sent only its new chunks
    _lose(tmp_path, 2)
    out = _ok(_run("restore", 4, {"root": str(tmp_path), "policy": {"replicas": 1}}))
    for rank, v in enumerate(out):
        assert v["same"] and v["step"] == 20 and v["peer_step"] == 20, v
        assert v["durable_read"] == 0, v  # not one byte from the durable tier, manifests included
        assert v["lost"] == [2]
    assert out[2]["bytes"]["peer"] > 0 and out[2]["bytes"]["local"] == 0 and out[2]["bytes"]["durable"] == 0
    assert out[0]["bytes"]["local"] > 0 and out[0]["bytes"]["peer"] == 0


def test_lose_two_of_six_with_parity(tmp_path):
    saved = _save(tmp_path, 6, {"data": 4, "parity": 2})
    for v in saved:
        assert v["protected"] == [10, 20] and v["failures"] == 0
        (_, _, own10, _, sent10, stored10) = v["stats"][0]
        assert stored10 < own10  # m/k = 0.5 of a node's bytes (plus padding), not a whole copy
        assert sent10 < 1.6 * own10  # each slice once: 1.25x + records and headers (2x if sent to both holders)
    _lose(tmp_path, 1, 4)
    out = _ok(_run("restore", 6, {"root": str(tmp_path), "policy": {"data": 4, "parity": 2}}))
    for v in out:
        assert v["same"] and v["step"] == 20 and v["peer_step"] == 20, v
        assert v["durable_read"] == 0, v
        assert v["lost"] == [1, 4]
    for n in (1, 4):
        assert out[n]["bytes"]["parity"] > 0 and out[n]["bytes"]["durable"] == 0


def test_too_many_lost_falls_back_to_durable(tmp_path):
    _save(tmp_path, 4, {"replicas": 1})
    _lose(tmp_path, 1, 2)  # node 1's only replica lived on node 2
    out = _ok(_run("restore", 4, {"root": str(tmp_path), "policy": {"replicas": 1}}))
    for v in out:
        assert v["same"] and v["step"] == 20, v
        assert v["peer_step"] is None
        assert "durable tier" in v["reason"] and "node 1's record" in v["reason"] and "survives 1" in v["reason"]
    assert out[1]["durable_chunk_read"] > 0


def test_corrupt_replica_detected_and_other_copy_used(tmp_path):
    _save(tmp_path, 4, {"replicas": 2})
    # node 2 is node 1's first replica holder: flip a byte in one of its replica chunks
    rec = json.loads((tmp_path / "peer2" / "records" / "000001" / "000000000020.json").read_bytes())
    victim = tmp_path / "peer2" / sorted(rec["keys"])[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    _lose(tmp_path, 1)
    out = _ok(_run("restore", 4, {"root": str(tmp_path), "policy": {"replicas": 2}}))
    for v in out:
        assert v["same"] and v["peer_step"] == 20 and v["durable_read"] == 0, v
        assert v["corrupt"] >= 1  # counted, and the copy on node 3 used
    assert out[1]["bytes"]["peer"] > 0 and out[1]["bytes"]["durable"] == 0


def test_corrupt_parity_block_other_blocks_used(tmp_path):
    """No block is read before planning: the sender finds the corrupt one as it reads it, sends
    nothing, and the stripe's spare block is asked for in a retry round. Node 0's stripe 0 plans
    data slices of nodes 1-3 and parity block 4, which node 4 holds (block 5, node 5's, is the
    spare)."""
    _save(tmp_path, 6, {"data": 4, "parity": 2})
    for f in (tmp_path / "peer4" / "parity").rglob("*"):
        if f.is_file() and not f.name.endswith(".json"):
            data = bytearray(f.read_bytes())
            data[0] ^= 0xFF
            f.write_bytes(bytes(data))
    _lose(tmp_path, 0)
    out = _ok(_run("restore", 6, {"root": str(tmp_path), "policy": {"data": 4, "parity": 2}}))
    for v in out:
        assert v["same"] and v["peer_step"] == 20 and v["durable_read"] == 0, v
        assert v["corrupt"] >= 1


@pytest.mark.parametrize("slice_hashes", [True, False])
def test_corrupt_data_slice_found_by_its_sender(tmp_path, slice_hashes):
    """A chunk of a survivor's bundle rots in its hot tier: the slice it sends for the lost
    node's stripe fails its recorded hash (or, in a record without slice hashes, the chunk its
    manifest hash), is not sent, and a parity block replaces it; the survivor's own restore
    repairs the chunk from the durable tier."""
    _save(tmp_path, 6, {"data": 4, "parity": 2})
    path = tmp_path / "peer1" / "records" / "000001" / "000000000020.json"
    rec = json.loads(path.read_bytes())
    if not slice_hashes:
        path.write_text(json.dumps({k: v for k, v in rec.items() if k != "slices"}))
    # node 1 holds data slice 1 of stripe 0, one of node 0's stripes: rot the chunk in its middle
    start, length = slice_span(sum(n for _, n in rec["bundle"]), 4, 1)
    at, key = 0, None
    for key, n in rec["bundle"]:
        if at + n > start + length // 2:
            break
        at += n
    victim = tmp_path / "hot1" / key
    data = bytearray(victim.read_bytes())
    data[start + length // 2 - at] ^= 0xFF  # a byte of slice 1
    victim.write_bytes(bytes(data))
    _lose(tmp_path, 0)
    out = _ok(_run("restore", 6, {"root": str(tmp_path), "policy": {"data": 4, "parity": 2}}))
    for v in out:
        assert v["same"] and v["peer_step"] == 20, v
        assert v["corrupt"] >= 1
    assert out[0]["bytes"]["parity"] > 0 and out[0]["bytes"]["durable"] == 0


def test_node_lost_during_replication_uses_previous_protected_step(tmp_path):
    args = {"root": str(tmp_path), "policy": {"replicas": 1, "round_bytes": 4096}, "steps": [10, 20],
            "kill": {"rank": 3, "step": 20, "round": 2}}
    res = _run("save", 4, args)
    assert res[3].returncode == -9, res[3].stderr[-800:]  # really killed mid-transfer
    for r in res[:3]:  # the survivors: step 20 committed, but never marked protected
        assert r.ok, (r.error, r.stderr[-1200:])
        assert r.value["protected"] == [10] and r.value["failures"] >= 1
    _lose(tmp_path, 3)
    out = _ok(_run("restore", 4, {"root": str(tmp_path), "policy": {"replicas": 1}}))
    for v in out:  # never a mix: the previous protected step, whole, from the peers
        assert v["same"] and v["step"] == 10 and v["peer_step"] == 10 and v["durable_read"] == 0, v


@pytest.mark.stress
@pytest.mark.parametrize("trial", range(4))
def test_random_loss_loop(tmp_path, trial):
    rng = random.Random(trial)
    policy = rng.choice([{"replicas": 1}, {"replicas": 2}, {"data": 4, "parity": 2}, {"data": 2, "parity": 1}])
    world = 6
    p = PeerPolicy(**policy)
    _save(tmp_path, world, policy, steps=(10, 20, 30))
    lost = sorted(rng.sample(range(world), rng.randint(1, 3)))
    _lose(tmp_path, *lost)
    out = _ok(_run("restore", world, {"root": str(tmp_path), "policy": policy}))
    if p.replicas:
        rebuildable = all(any((n + i) % world not in lost for i in range(1, p.replicas + 1)) for n in lost)
    else:
        rebuildable = all(sum(1 for n in lost if n // p.group == g) <= p.parity for g in range(world // p.group))
    for v in out:
        assert v["same"] and v["step"] == 30, (policy, lost, v)
        if rebuildable:
            assert v["peer_step"] == 30 and v["durable_read"] == 0, (policy, lost, v)
        else:
            assert v["peer_step"] is None and "durable tier" in v["reason"], (policy, lost, v)
