"""Which code made a checkpoint or a dataset version: two questions, two names.

``trainstore_version()`` is the version of this library (``git describe`` of its checkout
when it runs from one, else the installed package version): what wrote the bytes.
``code_version(path)`` is the git state of the user's working directory (``git:<sha>``,
``-dirty`` with uncommitted changes to tracked files; None outside git): what trained the
model or transformed the data. Checkpoint manifests and dataset versions record both, under
these two field names.
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib.metadata import PackageNotFoundError, version

GIT_TIMEOUT_S = 5


def _git(args: list[str], cwd: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)


@functools.lru_cache(maxsize=1)
def trainstore_version() -> str:
    """``git:<describe>`` of trainstore's own checkout, else ``trainstore <version>``."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = _git(["describe", "--always", "--dirty", "--tags"], here)
        if out.returncode == 0 and out.stdout.strip():
            return f"git:{out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"trainstore {version('trainstore')}"
    except PackageNotFoundError:  # a source tree that is neither installed nor in git
        return "unknown"


def code_version(path: str | None = None) -> str | None:
    """``git:<sha>[-dirty]`` of the git work tree at ``path`` (default: the current directory),
    or None outside git."""
    try:  # one git call: the header names HEAD, any other line is a change to a tracked file
        out = _git(["status", "--porcelain=v2", "--branch", "--untracked-files=no"], path)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    lines = out.stdout.splitlines()
    sha = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ") and len(ln.split()) == 3), None)
    if sha is None or sha == "(initial)":  # no commit yet
        return None
    return f"git:{sha}" + ("-dirty" if any(ln and not ln.startswith("#") for ln in lines) else "")


def manifest_fields() -> dict[str, str | None]:
    """The two fields a checkpoint manifest records: ``code_version`` and ``trainstore_version``."""
    return {"code_version": code_version(), "trainstore_version": trainstore_version()}


__all__ = ["code_version", "manifest_fields", "trainstore_version"]
