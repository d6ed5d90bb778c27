"""Tampered checkpoints: a manifest pointing at pickled or crafted bytes, absurd shapes and
sizes, fuzzed manifests. Restoring never executes stored bytes, never allocates what the
chunks do not back, and fails only with TrainstoreError subclasses."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from trainstore import open_store
from trainstore.checkpoint import CheckpointManager
from trainstore.checkpoint.format import manifest as mf
from trainstore.chunks import ChunkStore
from trainstore.errors import ManifestError, TrainstoreError

pytestmark = pytest.mark.timeout(180)
JOB = "tamper"


class _Payload:
    """Unpickling this creates the marker file: proof that stored bytes were executed."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _setup(tmp_path):
    store = open_store(str(tmp_path / "store"))
    mgr = CheckpointManager(store, JOB)
    mgr.save(1, {"w": np.arange(16, dtype=np.float32), "meta": {"epoch": 1}}, blocking=True)
    mgr.close()
    return store, json.loads(bytes(store.get(mf.manifest_key(JOB, 1))))


def _write(store, obj: dict, step: int = 1) -> None:
    """Write a (tampered) manifest with a *valid* checksum, so the deeper checks are reached."""
    obj = {k: v for k, v in obj.items() if k != "checksum"}
    store.delete(mf.manifest_key(JOB, step))
    store.delete(mf.verify_key(JOB, step))
    store.put(mf.manifest_key(JOB, step), json.dumps(mf.with_checksum(obj), separators=(",", ":")).encode())


def test_pickled_bytes_are_never_executed(tmp_path):
    marker = str(tmp_path / "PWNED")
    payload = pickle.dumps(_Payload(marker))
    store, orig = _setup(tmp_path)
    # 1. a chunk holding a pickle, referenced as a uint8 tensor with a correct hash
    ref = ChunkStore(store).put(payload, codec="raw").ref
    obj = json.loads(json.dumps(orig))
    obj["tensors"]["w"] = {"dtype": "numpy:|u1", "shape": [len(payload)], "nbytes": len(payload),
                           "chunks": [{"ref": ref.to_json()}]}
    _write(store, obj)
    restored = CheckpointManager(store, JOB).restore()
    assert bytes(restored["w"]) == payload  # loaded as inert bytes
    # 2. the pickle as a bytes value in the skeleton
    obj["skeleton"] = {"$dict": [["w", {"$ndarray": "w"}], ["blob", {"$bytes": base64.b64encode(payload).decode()}]]}
    _write(store, obj)
    assert CheckpointManager(store, JOB).restore()["blob"] == payload
    # 3. the manifest itself replaced by a pickle
    store.delete(mf.manifest_key(JOB, 1))
    store.put(mf.manifest_key(JOB, 1), payload)
    with pytest.raises(ManifestError):
        CheckpointManager(store, JOB).restore(step=1)
    # 4. a torch.save file (pickle inside a zip) as a chunk
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"x": _Payload(marker)}, buf)
    blob = buf.getvalue()
    ref = ChunkStore(store).put(blob, codec="raw").ref
    obj["tensors"]["w"] = {"dtype": "torch.uint8", "shape": [len(blob)], "nbytes": len(blob),
                           "chunks": [{"ref": ref.to_json()}]}
    obj["skeleton"] = {"$dict": [["w", {"$tensor": "w"}]]}
    _write(store, obj)
    assert bytes(CheckpointManager(store, JOB).restore()["w"].numpy()) == blob
    assert not os.path.exists(marker), "stored bytes were unpickled"


_ABSURD = [
    {"shape": [10**12]}, {"shape": [2**62, 2**62]}, {"shape": [-1]}, {"shape": [4], "nbytes": 16},
    {"nbytes": 10**15}, {"dtype": "numpy:O"}, {"dtype": "numpy:V1000000000"}, {"dtype": "torch.Tensor"},
]


def _restore_limited(root: str, steps: list[int]) -> list[str]:
    """Restore each step in a subprocess limited to 6 GiB of address space; one line each."""
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        from trainstore import open_store
        from trainstore.checkpoint import CheckpointManager
        from trainstore.errors import TrainstoreError
        mgr = CheckpointManager(open_store({root!r}), {JOB!r})
        for step in {steps!r}:
            try:
                mgr.restore(step=step)
            except TrainstoreError as e:
                print("REFUSED", step, type(e).__name__, str(e)[:160].replace("\\n", " "))
            else:
                print("LOADED", step)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = [line for line in res.stdout.splitlines() if line.startswith(("REFUSED", "LOADED"))]
    assert len(lines) == len(steps), (res.stdout, res.stderr[-2000:])
    return lines


def test_absurd_shapes_and_sizes_fail_before_allocating(tmp_path):
    """Each tampering is refused with a ManifestError before any large allocation (in a
    subprocess whose address space is limited, where a huge allocation would fail otherwise)."""
    store, orig = _setup(tmp_path)
    for i, change in enumerate(_ABSURD):
        obj = json.loads(json.dumps(orig))
        obj["step"] = 10 + i
        obj["tensors"]["w"].update(change)
        _write(store, obj, step=10 + i)
    # A small manifest whose 200 refs claim 64 MiB each (13 GB): refused, or failing on
    # the first missing chunk, never a 13 GB allocation that gets filled.
    refs = [{"ref": ["%064x" % (i + 1), "raw", 64 << 20, 64 << 20, 1]} for i in range(200)]
    obj = json.loads(json.dumps(orig))
    obj["step"] = 99
    obj["tensors"]["w"] = {"dtype": "numpy:|u1", "shape": [200 * (64 << 20)], "nbytes": 200 * (64 << 20),
                           "chunks": refs}
    _write(store, obj, step=99)
    lines = _restore_limited(str(tmp_path / "store"), [10 + i for i in range(len(_ABSURD))] + [99])
    bad = [line for line in lines[:-1] if not line.startswith("REFUSED") or "ManifestError" not in line]
    assert not bad, bad
    assert lines[-1].startswith("REFUSED"), lines[-1]


_nasty = st.sampled_from([float("inf"), -1, 2**70, True, 1.5, "", None, [], {}, [[[]]], "../../x",
                          "torch.float32", "numpy:<f4", {"$tensor": "w"}, {"$bytes": "!!"}, {"$size": ["a"]},
                          {"ref": ["0" * 64, "raw", 1, 1, 1]}, {"delta": ["0" * 64, "raw", 1, 1, 1]}])
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=12)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def test_fuzzed_manifests_only_raise_trainstore_errors(tmp_path):
    store, orig = _setup(tmp_path)
    orig = {k: v for k, v in orig.items() if k != "checksum"}
    paths = [p for p in _paths(orig) if p]

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(paths), value=st.one_of(_nasty, _json))
    def check(path, value):
        obj = json.loads(json.dumps(orig))
        target = obj
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        try:
            _write(store, obj)
        except ValueError:
            return  # not JSON-serialisable (e.g. inf in a strict dump): cannot be stored
        try:
            CheckpointManager(store, JOB).restore(step=1)
        except TrainstoreError:
            pass

    check()


def test_restore_memory_is_bounded_by_the_checkpoint(tmp_path):
    """Peak RSS of a restore stays within a small multiple of the checkpoint's size."""
    store = open_store(str(tmp_path / "store"))
    mgr = CheckpointManager(store, JOB)
    mgr.save(1, {"w": np.random.default_rng(0).standard_normal(16 << 20 >> 2, dtype=np.float32)}, blocking=True)
    mgr.close()
    code = textwrap.dedent(f"""
        import resource, sys
        sys.modules["torch"] = None  # numpy-only state: skip torch's import time
        from trainstore import open_store
        from trainstore.checkpoint import CheckpointManager
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        CheckpointManager(open_store({str(tmp_path / "store")!r}), {JOB!r}).restore()
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    grew = int(res.stdout.strip().splitlines()[-1])
    assert grew < 4 * (16 << 20), grew
