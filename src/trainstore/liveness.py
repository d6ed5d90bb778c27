"""Is the process that wrote a marker still alive? ("dead" only when provably so.)

A marker (a GC sweep's, or any other writer's that a waiter may stop waiting for) names its
writer: host name, boot id, PID namespace (and time namespace), pid and the pid's start time
(Linux ``/proc``). A waiter that finds the marker still "running" can then tell a live writer
from one whose process died (SIGKILL, OOM) and stop waiting for its deadline at once: a dead
process does nothing more, so acting after that point is as safe as after the deadline.

"Dead" needs every one of: the same host and boot (a reboot changes the boot id), the same
PID namespace (containers that share a host name but not a PID namespace number their
processes independently: pid 1 there is not pid 1 here), the same time namespace (start
times are counted in it), a ``/proc`` of that namespace on both sides, and then no process
with that pid and start time (pid reuse is caught by the start time). Anything else -
another host or container, no ``/proc``, a marker from an older writer without these
fields - is "unknown", and the caller falls back to the marker's deadline.
"""

from __future__ import annotations

import os
from typing import Literal

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: marker fields that must match this process's for a liveness verdict
_NAMESPACES = {"pidns": "/proc/self/ns/pid", "timens": "/proc/self/ns/time"}

State = Literal["alive", "dead", "unknown"]


def _boot_id() -> str | None:
    try:
        with open(_BOOT_ID_PATH) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _namespace(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _proc_is_own_pid_namespace() -> bool:
    """True when ``/proc`` shows this process's own PID namespace. A process moved into a new
    PID namespace without remounting ``/proc`` sees its parent's: pids read there mean other
    processes. ``NSpid`` then lists more than one pid (or ``/proc/self`` is not ``getpid()``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return line.split()[1:] == [str(os.getpid())]
        return os.readlink("/proc/self") == str(os.getpid())  # kernels before 4.1: no NSpid line
    except (OSError, IndexError):
        return False


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


def _local_context() -> dict | None:
    """This process's boot id and namespaces, or None when ``/proc`` cannot tell liveness."""
    boot = _boot_id()
    if boot is None or not _proc_is_own_pid_namespace():
        return None
    ctx: dict = {"boot": boot}
    for field, path in _NAMESPACES.items():
        ino = _namespace(path)
        if ino is not None:
            ctx[field] = ino
    return ctx if "pidns" in ctx else None


def identity() -> dict:
    """Fields naming this process, to put in a marker (liveness fields only where ``/proc``
    can vouch for them)."""
    me: dict = {"host": os.uname().nodename, "pid": os.getpid()}
    ctx = _local_context()
    start = _start_time(os.getpid()) if ctx is not None else None
    if ctx is not None and start is not None:
        me.update(ctx, pstart=start)
    return me


def writer_state(marker: dict) -> State:
    """"alive", "dead", or "unknown" (another host, boot or namespace; missing fields)."""
    pid, pstart = marker.get("pid"), marker.get("pstart")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(pstart, int) \
            or marker.get("host") != os.uname().nodename:
        return "unknown"
    ctx = _local_context()
    if ctx is None or marker.get("boot") != ctx["boot"] or not isinstance(marker.get("pidns"), int):
        return "unknown"
    for field in _NAMESPACES:  # a field this kernel lacks (no time namespaces) must be absent there too
        if marker.get(field) != ctx.get(field):
            return "unknown"
    return "alive" if _start_time(pid) == pstart else "dead"  # None: no such pid; else pid reused


def writer_dead(marker: dict) -> bool:
    """True only when the marker's writer provably ran here (host, boot, namespaces) and is gone."""
    return writer_state(marker) == "dead"


__all__ = ["State", "identity", "writer_dead", "writer_state"]
