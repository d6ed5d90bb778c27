"""Is the process that wrote a marker still alive? (Same host only; otherwise: unknown.)

A GC sweep's marker names its writer: host name, boot id, pid and the pid's start time (Linux
``/proc``). A saver on the same host that finds the marker still "running" can then tell a live
sweep from one whose process died (SIGKILL, OOM) and stop waiting for its deadline at once: a
dead process deletes nothing more, so the saver's re-check of its chunks after that point is as
safe as after the deadline. Pid reuse is caught by the start time, a reboot by the boot id.
Anywhere else (another host, no ``/proc``) the answer is "unknown" and the deadline rules.
"""

from __future__ import annotations

import os

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str | None:
    try:
        with open(_BOOT_ID_PATH) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22);
    None when there is no such process or it is a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: split after the last ')'
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):  # a zombie (killed, not yet reaped) runs no more code
            return None
        return int(fields[19])
    except (ValueError, IndexError):
        return None


def identity() -> dict:
    """Fields naming this process, to put in a marker."""
    me = {"host": os.uname().nodename, "pid": os.getpid()}
    boot, start = _boot_id(), _start_time(os.getpid())
    if boot is not None and start is not None:
        me.update(boot=boot, pstart=start)
    return me


def writer_dead(marker: dict) -> bool:
    """True only when the marker's writer ran on this host since this boot and is gone now."""
    pid, boot, pstart = marker.get("pid"), marker.get("boot"), marker.get("pstart")
    if not isinstance(pid, int) or not isinstance(pstart, int) or not isinstance(boot, str):
        return False
    if marker.get("host") != os.uname().nodename or boot != _boot_id():
        return False
    return _start_time(pid) != pstart  # None (no such pid) or another process with that pid


__all__ = ["identity", "writer_dead"]
