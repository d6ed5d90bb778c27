"""Child process for the WAL write-fault tests: ingests while its WAL disk runs full.

    python wal_fault_child.py STORE WAL_DIR BALLAST MODE START SEED

The WAL directory lies on a small tmpfs; ``BALLAST`` is a file on the same tmpfs. Before a
faulty write the child fills the tmpfs with the ballast, leaving a few pages (fewer than the
frame needs, so the append fails halfway with ENOSPC), and deletes it after the write.

MODE ``once``: write ids 0-99 (acknowledged), 100-199 under a full disk (fails), 200-299
(acknowledged), print ``DONE`` and wait to be killed. MODE ``loop``: random writes, about a
third of them under a full disk, and occasional commits, until SIGKILLed.

Prints ``ACK first last`` after each write returned, ``FAIL first last ErrorClass`` after
each write that raised, ``COMMIT version`` after each commit (all flushed).
"""

import errno
import os
import random
import sys

from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.errors import StoreError

PAGE = 4096


def payload(i: int, extra: int) -> str:
    """A payload that names its id, so a changed row is recognisable."""
    return f"{i}:" + "x" * extra


def fill(ballast: str, leave_pages: int) -> None:
    """Fill the filesystem of ``ballast`` up, then give back ``leave_pages`` pages."""
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = b"\0" * (64 << 10)
    size = 0
    try:
        while True:
            try:
                size += os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        os.ftruncate(fd, max(0, (size // PAGE - leave_pages) * PAGE))
    finally:
        os.close(fd)


def empty(ballast: str) -> None:
    try:
        os.unlink(ballast)
    except FileNotFoundError:
        pass


def write(ing: Ingestor, first: int, n: int, extra: int, ballast: str, leave_pages: int | None) -> None:
    records = [{"id": i, "payload": payload(i, extra)} for i in range(first, first + n)]
    if leave_pages is not None:
        fill(ballast, leave_pages)
    try:
        ing.write(records)
        print("ACK", first, first + n - 1, flush=True)
    except StoreError as exc:
        print("FAIL", first, first + n - 1, type(exc).__name__, flush=True)
    finally:
        empty(ballast)


def main() -> None:
    store, wal_dir, ballast, mode, start, seed = sys.argv[1:7]
    empty(ballast)  # a killed predecessor may have left it
    config = IngestConfig(wal_dir=wal_dir, shard_bytes=2 << 20, upload_workers=2, direct_bytes=None)
    ing = Ingestor(store, "faults", config=config)
    print("READY", ing.recovered_rows, flush=True)
    first = int(start)
    if mode == "once":
        write(ing, first, 100, 200, ballast, None)
        write(ing, first + 100, 100, 200, ballast, 2)  # a ~21 KB frame, 8 KiB of room
        write(ing, first + 200, 100, 200, ballast, None)
        print("DONE", flush=True)
        sys.stdin.read()  # wait for SIGKILL
        return
    rng = random.Random(int(seed))
    since_commit = 0
    while True:
        n = rng.randint(1, 200)
        leave = rng.choice([0, 1, 2, 4]) if rng.random() < 0.35 else None
        write(ing, first, n, rng.randint(0, 200), ballast, leave)
        first += n
        since_commit += n
        if rng.random() < 0.03 or since_commit > 10_000:  # commits stay far below shard_bytes
            print("COMMIT", ing.commit().version, flush=True)
            since_commit = 0


if __name__ == "__main__":
    main()
