"""A failed WAL append (ENOSPC, EIO halfway through a frame) is cut back before anything
else is acknowledged: records acknowledged after it survive replay, exactly once, in order;
the failed write is not stored. If the cut-back fails too, the log refuses appends."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.ingest.wal import SegmentIO, WriteAheadLog, read_segment
from trainstore.data.versions import load_version, read_shard
from trainstore.errors import CapacityError, StoreError
from trainstore.store import open_store

CHILD = os.path.join(os.path.dirname(__file__), "wal_fault_child.py")
DATASET = "faults"


def _ids(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64())})


class FaultyIO(SegmentIO):
    """Fails the next segment write after ``fail_after`` more bytes (``errno_``), and/or the
    next fsync, and/or every truncate."""

    def __init__(self) -> None:
        self.fail_after: int | None = None
        self.fail_sync = False
        self.fail_truncate = False
        self.errno_ = errno.EIO

    def write(self, fd: int, data) -> None:
        view = memoryview(data).cast("B")
        if self.fail_after is not None and view.nbytes > self.fail_after:
            super().write(fd, view[: self.fail_after])  # a partial frame really lands
            self.fail_after = None
            raise OSError(self.errno_, os.strerror(self.errno_))
        if self.fail_after is not None:
            self.fail_after -= view.nbytes
        super().write(fd, view)

    def sync(self, fd: int) -> None:
        if self.fail_sync:
            self.fail_sync = False
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().sync(fd)

    def truncate(self, fd: int, size: int) -> None:
        if self.fail_truncate:
            raise OSError(errno.EIO, "truncate failed (injected)")
        super().truncate(fd, size)


def _logged_ids(wal_dir: str, seq: int) -> list[int]:
    tables, _ = read_segment(os.path.join(wal_dir, f"seg-{seq:012d}.wal"))
    return [i for t in tables for i in t.column("id").to_pylist()]


@pytest.mark.parametrize("fail_after,err", [(7, errno.EIO), (40, errno.EIO), (300, errno.ENOSPC)])
def test_failed_append_is_cut_back_and_later_appends_replay(tmp_path, fail_after, err):
    io = FaultyIO()
    wal = WriteAheadLog(str(tmp_path / "w"), "mem://", "ds", io=io)
    wal.open_segment(1)
    wal.append(_ids(0, 100))
    io.fail_after, io.errno_ = fail_after, err  # inside the header (7), payload (40, 300)
    expected = CapacityError if err == errno.ENOSPC else StoreError
    with pytest.raises(expected, match=r"seg-000000000001\.wal.*not logged"):
        wal.append(_ids(100, 100))
    wal.append(_ids(200, 100))
    wal.close()
    assert _logged_ids(str(tmp_path / "w"), 1) == [*range(100), *range(200, 300)]


def test_failed_fsync_is_cut_back(tmp_path):
    io = FaultyIO()
    wal = WriteAheadLog(str(tmp_path / "w"), "mem://", "ds", io=io)
    wal.open_segment(1)
    wal.append(_ids(0, 10))
    io.fail_sync = True
    with pytest.raises(StoreError, match="not logged"):
        wal.append(_ids(10, 10))
    wal.append(_ids(20, 10))
    wal.close()
    assert _logged_ids(str(tmp_path / "w"), 1) == [*range(10), *range(20, 30)]


def test_failed_cut_back_refuses_appends_until_reopened(tmp_path):
    io = FaultyIO()
    wal_dir = str(tmp_path / "w")
    wal = WriteAheadLog(wal_dir, "mem://", "ds", io=io)
    wal.open_segment(1)
    wal.append(_ids(0, 50))
    io.fail_after, io.fail_truncate = 100, True
    with pytest.raises(StoreError, match="refuses appends until reopened"):
        wal.append(_ids(50, 50))
    io.fail_truncate = False
    with pytest.raises(StoreError, match="refuses appends until reopened"):
        wal.append(_ids(100, 50))  # nothing is acknowledged behind the torn frame
    wal.open_segment(2)
    with pytest.raises(StoreError, match="refuses appends until reopened"):
        wal.append(_ids(100, 50))  # not in a fresh segment either
    wal.close()
    assert os.path.getsize(os.path.join(wal_dir, "seg-000000000001.wal")) > 0
    reopened = WriteAheadLog(wal_dir, "mem://", "ds")
    assert [i for t in reopened.truncate_torn_tail(1) for i in t.column("id").to_pylist()] == list(range(50))
    reopened.drop_segment(2)
    reopened.open_segment(3)
    reopened.append(_ids(150, 5))
    reopened.close()
    assert _logged_ids(wal_dir, 3) == list(range(150, 155))


# -- real ENOSPC on a small tmpfs, then SIGKILL ----------------------------------------------
@pytest.fixture
def wal_fs(tmp_path):
    """An 8 MiB tmpfs for the WAL directory (needs root to mount)."""
    mnt = tmp_path / "walfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _run_child(store: str, fs, mode: str, start: int, seed: int, kill_after: float | None) -> list[list[str]]:
    """Run the child, SIGKILL it ``kill_after`` s after its first write returned or failed
    (or after DONE when None)."""
    proc = subprocess.Popen(
        [sys.executable, CHILD, store, str(fs / "wal"), str(fs / "ballast"), mode, str(start), str(seed)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    wait_for = ("DONE",) if kill_after is None else ("ACK", "FAIL")
    deadline = time.monotonic() + 60
    while not any(x.startswith(wait_for) for x in list(lines)) and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    time.sleep(kill_after or 0.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(5)
    err = proc.stderr.read()
    assert "Traceback" not in err, err
    assert any(x.startswith(wait_for) for x in lines), f"child never printed {wait_for}: {err}"
    return [line.split() for line in lines]


def _committed(store_path: str, wal_dir: str) -> list[dict]:
    """Replay the WAL in a fresh Ingestor, commit, and read every row back in order."""
    with Ingestor(store_path, DATASET, config=IngestConfig(wal_dir=wal_dir)) as ing:
        ing.commit()
    store = open_store(store_path)
    rows: list[dict] = []
    for info in load_version(store, DATASET).shards:
        rows += pq.read_table(pa.BufferReader(pa.py_buffer(read_shard(store, info)))).to_pylist()
    return rows


def test_enospc_mid_frame_then_sigkill_keeps_every_acknowledged_record(tmp_path, wal_fs):
    """100 acknowledged, 100 failing with a full disk halfway through the frame, 100
    acknowledged, SIGKILL: replay has exactly the 200 acknowledged, in order."""
    store = str(tmp_path / "store")
    lines = _run_child(store, wal_fs, "once", 0, 0, None)
    assert [p[:3] for p in lines if p[0] in ("ACK", "FAIL")] == [
        ["ACK", "0", "99"], ["FAIL", "100", "199"], ["ACK", "200", "299"]]
    assert [p[3] for p in lines if p[0] == "FAIL"] == ["CapacityError"]
    rows = _committed(store, str(wal_fs / "wal"))
    assert [r["id"] for r in rows] == [*range(100), *range(200, 300)]
    assert all(r["payload"] == f"{r['id']}:" + "x" * 200 for r in rows)


def fault_trials(store: str, fs, trials: int, seed: int) -> dict:
    """``trials`` children ingesting under random ENOSPC faults, each SIGKILLed at a random
    moment; then replay and compare. Returns the figures (acknowledged, lost, ...)."""
    rng = random.Random(seed)
    acked: list[int] = []
    failed: set[int] = set()
    for trial in range(trials):
        for parts in _run_child(store, fs, "loop", trial * 1_000_000, rng.randrange(1 << 30), rng.uniform(0.2, 1.0)):
            if parts[0] in ("ACK", "FAIL") and len(parts) >= 3:
                ids = range(int(parts[1]), int(parts[2]) + 1)
                (acked.extend if parts[0] == "ACK" else failed.update)(ids)
    rows = _committed(store, str(fs / "wal"))
    ids = [r["id"] for r in rows]
    seen = set(ids)
    return {
        "trials": trials,
        "acknowledged": len(acked),
        "failed_writes_rows": len(failed),
        "lost": len(set(acked) - seen),
        "duplicated": len(ids) - len(seen),
        "failed_but_stored": len(failed & seen),
        "changed": sum(1 for r in rows if not r["payload"].startswith(f"{r['id']}:")),
        "out_of_order": sum(1 for a, b in zip(ids, ids[1:]) if b <= a),
    }


def _check(figures: dict) -> None:
    assert figures["acknowledged"] > 0 and figures["failed_writes_rows"] > 0, figures
    for key in ("lost", "duplicated", "failed_but_stored", "changed", "out_of_order"):
        assert figures[key] == 0, figures


@pytest.mark.timeout(180)
def test_sigkill_under_random_enospc_loses_nothing_acknowledged(tmp_path, wal_fs):
    _check(fault_trials(str(tmp_path / "store"), wal_fs, trials=3, seed=7))


@pytest.mark.stress
@pytest.mark.timeout(1800)
def test_sigkill_under_random_enospc_stress(tmp_path, wal_fs):
    figures = fault_trials(str(tmp_path / "store"), wal_fs, trials=40, seed=11)
    print("[reliability]", figures)
    _check(figures)
