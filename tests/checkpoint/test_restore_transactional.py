"""What restore guarantees (issue 14 items 2 and 3).

* ``restore_into`` is transactional per candidate: a target is bit-identical to before when
  every candidate is corrupt, and equals the older checkpoint exactly (tensors it lacks
  untouched) when the newest is corrupt.
* "No checkpoint at all" (``NoCheckpointError``) is told apart from "none is valid"
  (``NoValidCheckpointError``, its base class).
* Only integrity failures mark a checkpoint bad: a real allocation failure (a child process
  under ``RLIMIT_AS``) or a local I/O error is raised and leaves no verify record.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from trainstore import errors as E
from trainstore.checkpoint import CheckpointManager
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions

pytestmark = pytest.mark.timeout(120)
JOB = "tx"
#: small chunks: every tensor has several pieces, so a corrupt piece sits among good ones
SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 20)


def _manager(root) -> CheckpointManager:
    return CheckpointManager(str(root), job=JOB, options=SMALL)


def _state(seed: int, with_b: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    state = {"a": torch.randn(6000, generator=g), "n": seed,
             "opt": {"m": np.random.default_rng(seed).standard_normal(3000).astype(np.float32)}}
    if with_b:
        state["b"] = torch.randint(0, 1000, (5000,), generator=g, dtype=torch.int64)
    return state


def _snapshot(state: dict) -> dict:
    """An independent deep copy of the bytes and values of ``state``."""
    return {"a": state["a"].clone(), "b": state["b"].clone() if "b" in state else None, "n": state["n"],
            "m": state["opt"]["m"].copy()}


def _assert_equals(state: dict, snap: dict) -> None:
    assert torch.equal(state["a"], snap["a"])
    if snap["b"] is not None:
        assert torch.equal(state["b"], snap["b"])
    assert state["n"] == snap["n"]
    assert np.array_equal(state["opt"]["m"], snap["m"])


def _last_ref(mgr: CheckpointManager, step: int, tensor: str):  # noqa: ANN202
    """The chunk reference of the last piece of ``tensor`` (a flattened name) of ``step``."""
    return mgr.manifest(step).tensors[tensor].chunks[-1].ref


def _corrupt_last_piece(root, mgr: CheckpointManager, step: int, tensor: str) -> None:
    """Flip a byte in the last piece of ``tensor`` of ``step``: its other pieces stay good."""
    path = os.path.join(root, _last_ref(mgr, step, tensor).key())
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("kw", [{}, {"scratch_bytes": 0}], ids=["scratch", "verify-then-reread"])
def test_every_candidate_corrupt_leaves_target_bit_identical(tmp_path, kw):
    mgr = _manager(tmp_path)
    for step in (1, 2):
        mgr.save(step, _state(step), kind="full")
    mgr.wait()
    for step in (1, 2):  # the last piece of "b": "a" and "m" of each step decode fine
        _corrupt_last_piece(tmp_path, mgr, step, "b")
    target = _state(99)
    before = _snapshot(target)
    with pytest.raises(E.NoValidCheckpointError) as info:
        mgr.restore_into(target, **kw)
    _assert_equals(target, before)
    assert "step 2: ChunkCorruptError" in str(info.value) and "step 1: ChunkCorruptError" in str(info.value)
    assert not isinstance(info.value, E.NoCheckpointError)
    mgr.close()


@pytest.mark.parametrize("kw", [{}, {"scratch_bytes": 0}], ids=["scratch", "verify-then-reread"])
def test_corrupt_newest_restores_older_exactly(tmp_path, kw):
    mgr = _manager(tmp_path)
    mgr.save(1, _state(1, with_b=False), kind="full")  # the older one has no "b"
    mgr.save(2, _state(2), kind="full")
    mgr.wait()
    _corrupt_last_piece(tmp_path, mgr, 2, "a")
    target = _state(99)
    expected = _snapshot(_state(1, with_b=False))
    expected["b"] = target["b"].clone()  # step 1 does not have it: it must stay as it was
    result = mgr.restore_into(target, **kw)
    assert result.step == 1 and [s for s, _ in result.skipped] == [2]
    _assert_equals(target, expected)
    mgr.close()


def test_restore_into_incremental_through_reread_path(tmp_path):
    """XOR deltas (two chunks per piece) verified, then read again into the target."""
    mgr = _manager(tmp_path)
    s0 = _state(5)
    mgr.save(0, s0, kind="full")
    s1 = {**s0, "a": s0["a"] + 0.001, "n": 6}
    mgr.save(1, s1, kind="incremental")
    mgr.wait()
    assert mgr.manifest(1).kind == "incremental"
    target = _state(99)
    mgr.restore_into(target, scratch_bytes=0)
    _assert_equals(target, _snapshot(s1))
    mgr.close()


def test_no_checkpoint_is_not_the_same_as_none_valid(tmp_path):
    mgr = _manager(tmp_path)
    with pytest.raises(E.NoCheckpointError, match="has no checkpoints"):
        mgr.restore()
    with pytest.raises(E.NoCheckpointError):
        mgr.restore(best="loss")
    # backward compatible: callers that caught NoValidCheckpointError to start fresh still do
    assert issubclass(E.NoCheckpointError, E.NoValidCheckpointError)
    assert issubclass(E.NoValidCheckpointError, E.NotFoundError)
    mgr.close()


# -- only integrity failures mark a checkpoint bad -------------------------------------------
_OOM_CHILD = textwrap.dedent("""
    import re, resource, sys
    import numpy as np
    from trainstore.checkpoint import CheckpointManager

    root, job = sys.argv[1], sys.argv[2]
    CheckpointManager(root, "warm").restore()  # every code path imported, pools started once
    mgr = CheckpointManager(root, job)
    vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10
    limit = vm + (48 << 20)  # far less than one checkpoint's 96 MiB tensor
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        mgr.restore()
    except BaseException as exc:
        print("ERR", type(exc).__name__, str(exc)[:200].replace("\\n", " "), flush=True)
    else:
        print("LOADED", flush=True)
""")
BIG = 96 << 20


def _big_state(step: int) -> dict:
    return {"w": np.full(BIG, step + 1, dtype=np.uint8), "step": step}  # dedups to one chunk


def test_out_of_memory_during_restore_marks_nothing(tmp_path):
    with CheckpointManager(str(tmp_path), "warm") as warm:
        warm.save(0, {"w": np.arange(10)}, blocking=True)
    mgr = CheckpointManager(str(tmp_path), JOB)
    for step in range(3):
        mgr.save(step, _big_state(step), blocking=True)
    res = subprocess.run([sys.executable, "-c", _OOM_CHILD, str(tmp_path), JOB], capture_output=True,
                         text=True, timeout=100, env={**os.environ, "MALLOC_ARENA_MAX": "1"})
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("ERR", "LOADED"))]
    assert len(lines) == 1, (res.stdout, res.stderr[-3000:])
    # a real allocation failure, reported as such; not "no valid checkpoint"
    assert lines[0].startswith("ERR CapacityError") and str(BIG) in lines[0], lines[0]
    assert [mf.load_verify_record(mgr.store, JOB, s) for s in range(3)] == [None, None, None]
    assert [i.status for i in mgr.list()] == [mgr.list()[0].status] * 3 and mgr.list()[0].status != "bad"
    state = mgr.restore()
    assert mgr.last_restore.step == 2 and not mgr.last_restore.skipped
    assert state["step"] == 2 and np.array_equal(state["w"], _big_state(2)["w"])
    for step in range(3):
        assert np.array_equal(mgr.restore(step=step)["w"], _big_state(step)["w"])
    mgr.close()


def test_local_io_error_is_raised_and_marks_nothing(tmp_path):
    mgr = _manager(tmp_path)
    mgr.save(1, _state(1), kind="full")
    mgr.save(2, _state(2), kind="full")
    mgr.wait()
    ref = _last_ref(mgr, 2, "a")
    path = os.path.join(tmp_path, ref.key())
    saved = open(path, "rb").read()
    os.unlink(path)
    os.symlink(path, path)  # reading fails with ELOOP, an OS error: no verdict on the checkpoint
    with pytest.raises(E.StoreError) as info:
        mgr.restore()
    assert not isinstance(info.value, E.IntegrityError) and ref.hash in str(info.value)
    with pytest.raises(E.StoreError):
        mgr.verify(step=2)
    assert mf.load_verify_record(mgr.store, JOB, 2) is None
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(saved)
    state = mgr.restore()
    assert mgr.last_restore.step == 2 and not mgr.last_restore.skipped
    _assert_equals(state, _snapshot(_state(2)))
    mgr.close()


def test_missing_chunk_is_an_integrity_failure(tmp_path):
    mgr = _manager(tmp_path)
    mgr.save(1, _state(1), kind="full")
    mgr.save(2, _state(2), kind="full")
    mgr.wait()
    ref = _last_ref(mgr, 2, "a")
    os.unlink(os.path.join(tmp_path, ref.key()))
    state = mgr.restore()
    assert mgr.last_restore.step == 1
    (step, reason), = mgr.last_restore.skipped
    assert step == 2 and reason.startswith("ChunkMissingError") and ref.hash in reason
    rec = mf.load_verify_record(mgr.store, JOB, 2)
    assert rec is not None and not rec.ok and ref.hash in rec.errors[0]
    _assert_equals(state, _snapshot(_state(1)))
    with pytest.raises(E.ChunkMissingError):
        mgr.restore(step=2)
    mgr.close()


_DECODE_OOM_CHILD = textwrap.dedent("""
    import re, resource, sys
    import numpy as np
    from trainstore.codecs import decode, encode

    codec = sys.argv[1]
    enc = bytes(encode(memoryview(np.zeros(48 << 20, dtype=np.uint8)), codec, 4, level=1, threads=1))
    vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10
    resource.setrlimit(resource.RLIMIT_AS, (vm + (16 << 20),) * 2)  # no room for 48 MiB decoded
    try:
        decode(enc, codec, 48 << 20, key="k", threads=1)
    except BaseException as exc:
        print("ERR", type(exc).__name__, flush=True)
    else:
        print("DECODED", flush=True)
""")


@pytest.mark.parametrize("codec", ["shuffle-lz4", "zstd"])
def test_out_of_memory_while_decoding_is_not_corruption(codec):
    """A decode that cannot allocate raises MemoryError, not ChunkCorruptError (which would
    make deep verify record a good checkpoint as bad)."""
    res = subprocess.run([sys.executable, "-c", _DECODE_OOM_CHILD, codec], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "MALLOC_ARENA_MAX": "1"})
    assert res.stdout.strip() == "ERR MemoryError", (res.stdout, res.stderr[-2000:])
