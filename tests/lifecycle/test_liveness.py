"""Is a sweep marker's writer alive? Dead only when provably so: same host, boot, PID namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from trainstore.liveness import identity, writer_dead, writer_state

CHILD = os.path.join(os.path.dirname(__file__), "ns_child.py")


def _own_pidns() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _dead_pid() -> int:
    """A pid with no process behind it right now (in this namespace)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_writer_in_this_namespace_is_dead():
    me = identity()
    marker = {**me, "pid": _dead_pid()}
    assert writer_dead(marker)
    assert writer_state(me) == "alive" and not writer_dead(me)  # this process


def test_a_marker_from_another_pid_namespace_is_not_judged_dead():
    """A container on the same host (same host name, same boot id) but with its own PID
    namespace writes pid 1 (or any pid that means another process here): unknown, not dead."""
    me = identity()
    for pid in (_dead_pid(), 1):  # no such process here / another process here
        foreign = {**me, "pid": pid, "pstart": 12345, "pidns": _own_pidns() + 1}
        assert not writer_dead(foreign), foreign
    assert me.get("pidns") == _own_pidns()  # our own markers name our namespace
    # a marker without a namespace (an older writer, or one without /proc) is unknown too
    legacy = {k: v for k, v in me.items() if k != "pidns"}
    assert not writer_dead({**legacy, "pid": _dead_pid()})


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare(1) for a real PID namespace")
@pytest.mark.parametrize("mount_proc", [True, False], ids=["own-proc", "parent-proc"])
def test_a_live_process_in_another_pid_namespace_is_not_judged_dead(mount_proc):
    args = ["unshare", "--pid", "--fork"] + (["--mount-proc"] if mount_proc else []) + [sys.executable, CHILD]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    try:
        marker = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert marker["host"] == os.uname().nodename
        assert marker["pid"] != proc.pid  # its own namespace numbers it differently
        assert not writer_dead(marker), marker  # it is alive: a saver must keep waiting
        assert writer_state(marker) == "unknown"  # another namespace (or its /proc is ours): the deadline rules
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(30)
