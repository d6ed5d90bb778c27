"""Packs of small tensors (issue 18 item 2b): format versions, per-tensor verification, range
reads, incrementals, fallback past a corrupt pack, and a property test of random states."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.format.packs import ALIGN, plan_packs
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ChunkCorruptError, ConfigError, ManifestError

pytestmark = pytest.mark.timeout(180)

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "v1_store")
OPTS = WriteOptions(chunk_bytes=64 << 10, max_inflight_bytes=4 << 20, pack_below=16 << 10, pack_bytes=64 << 10)
INCR = CheckpointPolicy(full_every=10, incremental_every=1)


def _bytes(x) -> bytes:
    return x.contiguous().view(torch.uint8).numpy().tobytes() if isinstance(x, torch.Tensor) else x.tobytes()


def _chunk_files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "chunks")) for f in fs]


def _small_state(n: int = 40) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"model": {f"b{i}": torch.randn(50 + 7 * i, generator=g) for i in range(n)},
            "optim": {"step": torch.tensor(5), "m": torch.randn(300, generator=g).to(torch.bfloat16)},
            "big": torch.randn(40000, generator=g)}  # 160 KiB: three chunks of 64 KiB, not packed


# -- format versions ------------------------------------------------------------------------
def test_manifest_written_by_the_pre_pack_code_still_restores(tmp_path):
    """tests/checkpoint/data/v1_store was written by the code before packs (format 1: a full
    and an incremental step, see the state below); both restore bit-exactly."""
    root = str(tmp_path / "store")
    shutil.copytree(FIXTURE, root)
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(1500, generator=g), torch.randn(10, generator=g).to(torch.bfloat16)
    with CheckpointManager(root, job="v1") as mgr:
        assert [json.loads(open(os.path.join(root, mf.manifest_key("v1", s))).read())["format"] for s in (0, 1)] \
            == ["trainstore.checkpoint/1"] * 2
        assert mgr.manifest(1).kind == "incremental"
        s0, s1 = mgr.restore(0), mgr.restore(1)
        assert _bytes(s0["w"]) == _bytes(w) and _bytes(s0["b"]) == _bytes(b) and int(s0["step"]) == 3
        w1 = w.clone()
        w1[::7] += 1.0
        assert _bytes(s1["w"]) == _bytes(w1) and int(s1["step"]) == 4 and s1["note"] == "v1 fixture"
        assert s1["arr"].tolist() == np.arange(12, dtype=np.int16).reshape(3, 4).tolist()
        assert all(r.ok for r in mgr.verify())


def test_a_manifest_of_a_newer_format_is_a_clear_error(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=OPTS) as mgr:
        mgr.save(1, _small_state(), blocking=True)
        obj = mgr.manifest(1).to_json()
    assert obj["format"] == "trainstore.checkpoint/2"  # it holds packs
    obj["format"] = "trainstore.checkpoint/3"
    data = json.dumps(mf.with_checksum(obj), separators=(",", ":")).encode()
    with pytest.raises(ManifestError, match="format version 3 is newer .* upgrade trainstore"):
        mf.Manifest.from_bytes(data, "x")
    obj["format"] = "other.tool/1"
    with pytest.raises(ManifestError, match="unknown format"):
        mf.Manifest.from_bytes(json.dumps(mf.with_checksum(obj), separators=(",", ":")).encode(), "x")


def test_without_packs_the_manifest_stays_format_1(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=WriteOptions(pack_below=0)) as mgr:
        mgr.save(1, _small_state(), blocking=True)
    raw = json.loads(open(os.path.join(tmp_path, mf.manifest_key("j", 1))).read())
    assert raw["format"] == "trainstore.checkpoint/1"


@pytest.mark.parametrize("at", [[0, 10 ** 9], [-1, 4], "0,4", [0]])
def test_a_packed_entry_outside_its_pack_is_rejected(at):
    ref = ["a" * 64, "raw", 128, 128, 4]
    with pytest.raises(ManifestError, match="packed chunk entry"):
        mf.ChunkEntry.from_json({"pack": ref, "at": at, "hash": "b" * 64})


def test_pack_options_are_checked():
    with pytest.raises(ConfigError, match="pack_below"):
        WriteOptions(pack_below=8 << 20, pack_bytes=4 << 20)
    with pytest.raises(ConfigError, match="pack_bytes"):
        WriteOptions(pack_below=0, pack_bytes=100)


# -- packing --------------------------------------------------------------------------------
def test_plan_packs_groups_by_key_and_size():
    items = [("a", 30, "x"), ("b", 30, "y"), ("c", 30, "x"), ("d", 10, "x"), ("e", 100, "x")]
    # x: a@0, c@64 (aligned) -> 94 bytes; d would end at 128+10 > 100: new pack; e alone
    assert plan_packs(items, 100) == [["a", "c"], ["d"], ["e"], ["b"]]
    assert ALIGN == 64


def test_small_tensors_share_a_few_chunks_and_restore_bit_exactly(tmp_path):
    state = _small_state()
    with CheckpointManager(str(tmp_path), job="j", options=OPTS) as mgr:
        mgr.save(1, state, blocking=True)
        m = mgr.manifest(1)
        small = [n for n in m.tensors if n != "big"]
        assert all(len(m.tensors[n].chunks) == 1 and m.tensors[n].chunks[0].is_packed for n in small)
        assert not any(c.is_packed for c in m.tensors["big"].chunks) and len(m.tensors["big"].chunks) == 3
        packs = {m.tensors[n].chunks[0].ref for n in small}
        # model (float32) and optim (int64 step, bf16 m) never share a pack: 3 groups
        assert len(packs) == 3
        assert len(_chunk_files(str(tmp_path))) == 3 + 3
        for n in small:  # each member has its own hash and span inside its pack
            c = m.tensors[n].chunks[0]
            assert c.span[0] % ALIGN == 0 and c.span[0] + c.span[1] <= c.ref.size and c.size == m.tensors[n].nbytes
        got = mgr.restore(1)
        for k, v in state["model"].items():
            assert _bytes(got["model"][k]) == _bytes(v)
        assert _bytes(got["optim"]["m"]) == _bytes(state["optim"]["m"]) and int(got["optim"]["step"]) == 5
        assert _bytes(got["big"]) == _bytes(state["big"])
        assert mgr.verify(1)[0].ok


def _flip_member(root: str, mgr: CheckpointManager, step: int, name: str) -> str:
    c = mgr.manifest(step).tensors[name].chunks[0]
    assert c.is_packed and c.ref.codec == "raw", c
    path = os.path.join(root, c.ref.key())
    data = bytearray(open(path, "rb").read())
    data[c.span[0] + c.span[1] // 2] ^= 0x01
    open(path, "wb").write(bytes(data))
    return os.path.basename(path).split(".")[0]


def test_one_tensor_is_read_by_range_and_verified_alone(tmp_path):
    """A flipped byte inside one member of a raw pack: another member of the same pack still
    restores (read by range, its own hash), the damaged one is a ChunkCorruptError naming
    the pack."""
    state = {"model": {"a": torch.randn(1000), "b": torch.randn(1000)}}
    opts = WriteOptions(raw_above=0.01, pack_below=16 << 10, pack_bytes=64 << 10)  # raw packs
    with CheckpointManager(str(tmp_path), job="j", options=opts) as mgr:
        mgr.save(1, state, blocking=True)
        pack = _flip_member(str(tmp_path), mgr, 1, "model/a")
        got = mgr.restore(1, only="model/b")
        assert _bytes(got["model"]["b"]) == _bytes(state["model"]["b"])
        with pytest.raises(ChunkCorruptError, match=pack):
            mgr.restore(1, only="model/a")
        assert not mgr.verify(1)[0].ok


def test_a_corrupt_byte_in_a_pack_marks_only_that_checkpoint_bad(tmp_path):
    g = torch.Generator().manual_seed(3)
    state = {"model": {f"p{i}": torch.randn(200, generator=g) for i in range(10)}}
    opts = WriteOptions(raw_above=0.01, pack_below=16 << 10, pack_bytes=64 << 10)
    with CheckpointManager(str(tmp_path), job="j", policy=CheckpointPolicy(full_every=1), options=opts) as mgr:
        snaps = []
        for step in range(3):
            for t in state["model"].values():
                t += 0.5
            mgr.save(step, state, blocking=True)
            snaps.append({k: _bytes(v) for k, v in state["model"].items()})
        expected_1 = snaps[1]
        _flip_member(str(tmp_path), mgr, 2, "model/p4")
        got = mgr.restore()
        assert mgr.last_restore.step == 1 and "Corrupt" in mgr.last_restore.skipped[0][1]
        assert {k: _bytes(v) for k, v in got["model"].items()} == expected_1
        assert [r.ok for r in mgr.verify()] == [True, True, False]


def test_incremental_repacks_only_changed_small_tensors(tmp_path):
    state = _small_state()
    with CheckpointManager(str(tmp_path), job="j", policy=INCR, options=OPTS) as mgr:
        mgr.save(0, state, blocking=True)
        state["model"]["b3"] += 1.0
        state["optim"]["step"] += 1
        info = mgr.save(1, state, blocking=True).wait()
        m = mgr.manifest(1)
        assert m.kind == "incremental"
        changed = {"model/b3", "optim/step"}
        for n, t in m.tensors.items():
            if n == "big":
                continue
            assert t.chunks[0].same_as_base == (n not in changed), n
        new_packs = {m.tensors[n].chunks[0].ref for n in changed}
        assert len(new_packs) == 2  # model (float32) and optim (int64): one small new pack each
        assert all(r.size < 1024 for r in new_packs)
        assert info.written_bytes < 1024 + 64  # only the two changed tensors' packs were written
        got = mgr.restore(1)
        assert _bytes(got["model"]["b3"]) == _bytes(state["model"]["b3"]) and int(got["optim"]["step"]) == 6
        assert all(_bytes(got["model"][k]) == _bytes(v) for k, v in state["model"].items())


def test_a_full_save_of_unchanged_small_tensors_dedups_its_packs(tmp_path):
    state = _small_state()
    with CheckpointManager(str(tmp_path), job="j", policy=CheckpointPolicy(full_every=1), options=OPTS) as mgr:
        mgr.save(0, state, blocking=True)
        state["big"] += 1.0
        info = mgr.save(1, state, blocking=True).wait()
        assert info.written_bytes <= state["big"].nbytes  # the packs were there already


# -- property: random states roundtrip through full and incremental saves --------------------
_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.uint8]


@st.composite
def _states(draw):
    n_small = draw(st.integers(1, 30))
    n_large = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    g = torch.Generator().manual_seed(seed)
    state: dict = {}
    for i in range(n_small):
        dt = draw(st.sampled_from(_DTYPES))
        numel = draw(st.integers(0, 3000))
        top = draw(st.sampled_from(["model", "optim", "extra"]))
        state.setdefault(top, {})[f"t{i}"] = (torch.randn(numel, generator=g) * 50).to(dt)
    for i in range(n_large):
        state.setdefault("model", {})[f"L{i}"] = torch.randn(draw(st.integers(20000, 50000)), generator=g)
    changes = draw(st.lists(st.integers(0, n_small + n_large - 1), max_size=6))
    return state, changes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_states())
def test_random_states_roundtrip_bit_exactly_through_full_and_incremental(tmp_path_factory, case):
    state, changes = case
    root = str(tmp_path_factory.mktemp("prop"))
    opts = WriteOptions(chunk_bytes=32 << 10, max_inflight_bytes=1 << 20, pack_below=8 << 10, pack_bytes=16 << 10)
    leaves = [t for group in state.values() for t in group.values()]
    with CheckpointManager(root, job="p", policy=INCR, options=opts) as mgr:
        mgr.save(0, state, blocking=True)
        snap0 = {(k, n): _bytes(t) for k, g in state.items() for n, t in g.items()}
        for i in changes:
            t = leaves[i]
            if t.numel():
                t.view(-1)[0] = t.view(-1)[-1] + 1
        mgr.save(1, state, blocking=True)
        assert mgr.manifest(1).kind == "incremental"
        snap1 = {(k, n): _bytes(t) for k, g in state.items() for n, t in g.items()}
        for step, snap in ((0, snap0), (1, snap1)):
            got = mgr.restore(step)
            assert {(k, n): _bytes(t) for k, g in got.items() for n, t in g.items()} == snap
            assert all(got[k][n].dtype == state[k][n].dtype for k, n in snap)
        assert all(r.ok for r in mgr.verify())


def test_a_pack_deleted_by_gc_is_rebuilt_from_its_members_or_refused(tmp_path):
    from trainstore.checkpoint.format.packs import rebuild_pack
    from trainstore.errors import IntegrityError

    state = {"model": {"a": torch.randn(100), "b": torch.randn(30)}}
    with CheckpointManager(str(tmp_path), job="j", options=OPTS) as mgr:
        mgr.save(1, state, blocking=True)
        m = mgr.manifest(1)
        members = [(m.tensors[f"model/{k}"].chunks[0], memoryview(_bytes(state["model"][k]))) for k in ("a", "b")]
        ref = members[0][0].ref
        stored = bytes(mgr.chunks.get(ref))
        assert bytes(rebuild_pack(mgr.chunks, ref, members)) == stored
        with pytest.raises(IntegrityError, match="cannot be rebuilt"):
            rebuild_pack(mgr.chunks, ref, members[:1])  # a member this save does not hold
