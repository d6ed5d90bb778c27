"""A store directory whose writes really fail: ENOSPC on a full 1 MiB tmpfs (as root), else
a directory made read-only with chmod (as another user). The ``breakable`` fixture is in
tests/checkpoint/conftest.py."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class BreakableDir:
    """A store directory whose writes fail between ``break_()`` and ``heal()``."""

    def __init__(self, root, tmpfs: bool) -> None:
        self.root = root
        self.store = root / "store"
        self.store.mkdir()
        self.tmpfs = tmpfs
        self.ballast = root / "ballast"

    def break_(self) -> None:
        if self.tmpfs:  # fill the filesystem: every new object write gets ENOSPC
            fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                for size in (65536, 4096, 1):  # down to the last partial page
                    try:
                        while True:
                            os.write(fd, b"\0" * size)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
            finally:
                os.close(fd)
        else:
            for d, _dirs, _files in os.walk(self.store):
                os.chmod(d, stat.S_IRUSR | stat.S_IXUSR)

    def heal(self) -> None:
        if self.tmpfs:
            os.unlink(self.ballast)
        else:
            for d, _dirs, _files in os.walk(self.store):
                os.chmod(d, stat.S_IRWXU)


def breakable_dir(tmp_path: Path) -> Iterator[BreakableDir]:
    """``BreakableDir`` under ``tmp_path``: a tmpfs as root, else chmod."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() == 0:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
        if res.returncode == 0:
            try:
                yield BreakableDir(mnt, tmpfs=True)
            finally:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
            return
        pytest.skip(f"root, but cannot mount a tmpfs: {res.stderr.decode().strip()}")  # chmod does not stop root
    d = BreakableDir(mnt, tmpfs=False)
    try:
        yield d
    finally:
        d.heal()
        shutil.rmtree(mnt, ignore_errors=True)
