"""Read checks (``trainstore.digests``): every piece a save writes records the xxh3-128 of
its bytes, a restore compares pieces against it instead of re-hashing them with BLAKE3
(0.08 instead of 0.4 CPU seconds per GiB), corruption is still caught on every read path, a
deep ``verify`` checks both digests, and manifests without checks (older writers) still
restore through BLAKE3."""

from __future__ import annotations

import json
import os
import threading

import blake3
import numpy as np
import pytest
import xxhash

from trainstore import digests as dg, open_store
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import IntegrityError, ManifestError, NoValidCheckpointError

pytestmark = pytest.mark.timeout(120)
JOB = "checks"


def _state(scale: float = 1.0) -> dict:
    rng = np.random.default_rng(0)
    return {
        "w": (rng.standard_normal(300_000).astype(np.float32) * scale),  # several raw pieces
        "zeros": np.zeros(200_000, dtype=np.float32),
        "ids": np.arange(100_000, dtype=np.int64),  # compresses: a shuffle-lz4 piece
        "small": np.full(10, scale, dtype=np.float32),  # packed
        "b": np.ones(20, dtype=np.float32),  # packed, unchanged between saves
        "step": 1,
    }


def _manager(store, ready_copies: bool = False) -> CheckpointManager:
    """Without restore-ready copies by default, so restores read the deltas and their bases."""
    opts = WriteOptions(chunk_bytes=256 << 10)
    policy = CheckpointPolicy(full_every=10, ready_copies=ready_copies)
    return CheckpointManager(store, JOB, policy=policy, options=opts)


def _pieces(store, step: int):
    m = mf.load_manifest(store, JOB, step)
    return m, [(name, p) for name, t in m.tensors.items() for p in t.chunks]


def _saved(tmp_path, ready_copies: bool = False):
    store = open_store(str(tmp_path / "store"))
    with _manager(store, ready_copies) as mgr:
        mgr.save(1, _state(), blocking=True)
        mgr.save(2, _state(1.0001), blocking=True, kind="incremental")  # deltas, same-as-base, packs
    return store


def _piece_bytes(state: dict, name: str, pieces) -> list[bytes]:
    raw = np.ascontiguousarray(state[name]).view(np.uint8).tobytes()
    out, pos = [], 0
    for p in pieces:
        out.append(raw[pos:pos + p.size])
        pos += p.size
    return out


def test_every_piece_records_the_xxh3_of_its_bytes_and_the_format_is_unchanged(tmp_path):
    store = _saved(tmp_path)
    kinds = set()
    for step, state in ((1, _state()), (2, _state(1.0001))):
        m, pieces = _pieces(store, step)
        raw_manifest = json.loads(bytes(store.get(mf.manifest_key(JOB, step))))
        assert raw_manifest["format"] in (mf.FORMAT, mf.FORMAT_V1)  # old readers ignore the key
        for name, t in m.tensors.items():
            for p, data in zip(t.chunks, _piece_bytes(state, name, t.chunks)):
                assert p.check == xxhash.xxh3_128(data).hexdigest(), (step, name)
                assert p.logical_hash() == blake3.blake3(data).hexdigest()
                kinds.add("delta" if p.is_delta else "packed" if p.is_packed else
                          "same" if p.same_as_base else p.ref.codec)
    assert {"delta", "packed", "raw"} <= kinds and kinds - {"delta", "packed", "raw", "same"}, kinds


class _Counting:
    """Bytes each digest saw, by wrapping the modules ``trainstore.digests`` calls."""

    def __init__(self, monkeypatch) -> None:
        self.bytes = {"blake3": 0, "xxh3": 0}
        self._lock = threading.Lock()
        counting = self

        class Wrapped:
            def __init__(self, kind: str, inner) -> None:
                self.kind, self.inner = kind, inner

            def update(self, data):
                counting.add(self.kind, data)
                self.inner.update(data)
                return self

            def hexdigest(self) -> str:
                return self.inner.hexdigest()

        class B3:
            AUTO = blake3.blake3.AUTO

            @staticmethod
            def blake3(data=b"", **kw):
                return Wrapped("blake3", blake3.blake3(**kw)).update(data)

        class X3:
            @staticmethod
            def xxh3_128(data=b""):
                return Wrapped("xxh3", xxhash.xxh3_128()).update(data)

        monkeypatch.setattr(dg, "blake3", B3)
        monkeypatch.setattr(dg, "xxhash", X3)

    def add(self, kind: str, data) -> None:
        with self._lock:
            self.bytes[kind] += memoryview(data).nbytes


@pytest.mark.parametrize("step", [1, 2])
def test_restore_compares_the_read_check_not_blake3(tmp_path, monkeypatch, step):
    store = _saved(tmp_path)
    logical = mf.load_manifest(store, JOB, step).logical_bytes
    seen = _Counting(monkeypatch)
    with _manager(store) as mgr:
        got = mgr.restore(step)
    want = _state(1.0001 if step == 2 else 1.0)
    np.testing.assert_array_equal(got["w"], want["w"])
    np.testing.assert_array_equal(got["small"], want["small"])
    assert seen.bytes["xxh3"] >= logical
    assert seen.bytes["blake3"] < logical // 50, seen.bytes  # manifests only, no piece


def test_manifests_without_checks_restore_through_blake3(tmp_path, monkeypatch):
    """What writers before read checks left (tests/checkpoint/data/v1_store is one such
    store; here the same checkpoints with their checks taken out)."""
    store = _saved(tmp_path)
    for step in (1, 2):
        obj = json.loads(bytes(store.get(mf.manifest_key(JOB, step))))
        for t in obj["tensors"].values():
            for c in t["chunks"]:
                c.pop("check", None)
        _write(store, obj, step)
    seen = _Counting(monkeypatch)
    with _manager(store) as mgr:
        got = mgr.restore(2)
        assert mgr.verify(2, deep=True)[0].ok
    np.testing.assert_array_equal(got["w"], _state(1.0001)["w"])
    assert seen.bytes["xxh3"] == 0 and seen.bytes["blake3"] >= mf.load_manifest(store, JOB, 2).logical_bytes


def _write(store, obj: dict, step: int) -> None:
    """Rewrite a manifest with a valid checksum (so the entries themselves are what is tested)."""
    obj = {k: v for k, v in obj.items() if k != "checksum"}
    store.delete(mf.verify_key(JOB, step))
    store.put(mf.manifest_key(JOB, step), json.dumps(mf.with_checksum(obj), separators=(",", ":")).encode())


def _chunk_file(store, ref) -> str:
    path = store.local_path(ref.key("chunks"))
    assert path is not None and os.path.exists(path)
    return path


def _flip(path: str, at: int | None = None) -> None:
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        i = len(data) // 2 if at is None else at
        data[i] ^= 0x40
        f.seek(0)
        f.write(data)


@pytest.mark.parametrize("which", ["raw", "compressed", "delta", "base_of_delta", "packed"])
def test_a_flipped_byte_is_caught_by_the_read_check(tmp_path, which):
    store = _saved(tmp_path)
    m1, p1 = _pieces(store, 1)
    m2, p2 = _pieces(store, 2)
    if which == "raw":
        step, ref = 1, next(p.ref for n, p in p1 if n == "w" and p.ref.codec == "raw")
    elif which == "compressed":
        step, ref = 1, next(p.ref for n, p in p1 if n == "ids")
    elif which == "delta":
        step, ref = 2, next(p.ref for n, p in p2 if p.is_delta)
    elif which == "base_of_delta":
        step, ref = 2, next(p.base for n, p in p2 if p.is_delta)
    else:
        step, ref = 1, next(p.ref for n, p in p1 if n == "small")
    assert ref.codec != "raw" or which != "compressed"
    _flip(_chunk_file(store, ref))
    with _manager(store) as mgr:
        with pytest.raises(IntegrityError, match=ref.hash[:12]):
            mgr.restore(step)  # the step asked: no fallback to an older one
        assert not mgr.verify(step, deep=True)[0].ok
        if which in ("raw", "base_of_delta"):  # both steps read it: none is left
            with pytest.raises(NoValidCheckpointError, match=ref.hash[:12]):
                mgr.restore()


def test_a_flipped_byte_in_a_restore_ready_copy_falls_back_to_the_delta(tmp_path):
    store = _saved(tmp_path, ready_copies=True)
    copies = [k for k in (m.key for m in store.list("")) if "/ready/" in k or k.startswith("ready/")]
    assert copies
    for key in copies:
        _flip(store.local_path(key))
    with _manager(store, ready_copies=True) as mgr:
        got = mgr.restore(2)
    np.testing.assert_array_equal(got["w"], _state(1.0001)["w"])


@pytest.mark.parametrize("tensor, key", [("w", "ref"), ("small", "pack")])
def test_a_wrong_read_check_fails_restore_and_deep_verify_names_it(tmp_path, tensor, key):
    """The chunk is intact but the manifest's check disagrees with it (a writer bug, or a
    manifest edited by hand): restore refuses the step, a deep verify reports it - for a
    plain piece (its chunk's scrub) and a packed one (its pack read once, members checked)."""
    store = _saved(tmp_path)
    obj = json.loads(bytes(store.get(mf.manifest_key(JOB, 1))))
    entry = obj["tensors"][tensor]["chunks"][0]
    entry["check"] = "0" * 32
    _write(store, obj, 1)
    with _manager(store) as mgr:
        with pytest.raises(IntegrityError, match=entry[key][0][:12]):
            mgr.restore(1)
        rec = mgr.verify(1, deep=True)[0]
    assert not rec.ok and any(entry[key][0][:12] in e for e in rec.errors), rec.errors


@pytest.mark.parametrize("bad", ["", "XYZ", "0" * 31, "A" * 32, 12, ["0" * 32], "0" * 64])
def test_a_malformed_read_check_is_a_manifest_error(tmp_path, bad):
    store = _saved(tmp_path)
    obj = json.loads(bytes(store.get(mf.manifest_key(JOB, 1))))
    obj["tensors"]["w"]["chunks"][0]["check"] = bad
    _write(store, obj, 1)
    with pytest.raises(ManifestError, match="read check"):
        mf.load_manifest(store, JOB, 1)


def test_digests_is_both_hashes_in_one_pass():
    data = np.random.default_rng(1).integers(0, 255, (3 << 18) + 17, dtype=np.uint8)
    assert dg.digests(data) == (blake3.blake3(data).hexdigest(), xxhash.xxh3_128(data).hexdigest())
    assert dg.digests(b"") == (blake3.blake3(b"").hexdigest(), xxhash.xxh3_128(b"").hexdigest())
