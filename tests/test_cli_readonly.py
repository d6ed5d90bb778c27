"""Read-only CLI commands on a mistyped store, job or model (issue 26 item 8), through the CLI
in a subprocess: they never create anything, and an unknown store, job or model exits non-zero
with ``NotFoundError`` and what exists. A cron ``verify`` never passes while verifying nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from trainstore import CheckpointManager, open_store


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainstore", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "80"})


def tree(root) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files + [""])


@pytest.fixture(scope="module")
def store_with_job(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cli_ro") / "store")
    with CheckpointManager(root, "run") as mgr:
        mgr.save(1, {"w": torch.ones(4)}, blocking=True)
    return root


READ_ONLY = [
    ("ckpt", "ls", "{P}"),
    ("ckpt", "ls", "{P}", "-j", "run"),
    ("ckpt", "show", "{P}", "-j", "run"),
    ("ckpt", "verify", "{P}", "-j", "run"),
    ("ckpt", "stats", "{P}", "-j", "run"),
    ("ckpt", "models", "{P}"),
    ("data", "ls", "{P}"),
    ("store", "ls", "{P}"),
]


@pytest.mark.parametrize("argv", READ_ONLY, ids=lambda a: " ".join(a[:2]) + (" -j" if "-j" in a else ""))
def test_missing_store_is_not_found_and_not_created(tmp_path, argv):
    typo = str(tmp_path / "TYPO")
    proc = cli(*(a.format(P=typo) for a in argv))
    assert proc.returncode != 0, proc.stdout
    assert "NotFoundError" in proc.stderr and typo in proc.stderr.replace("\n", ""), proc.stderr
    assert not os.path.exists(typo), "a read-only command created the store directory"


def test_unknown_job_names_the_jobs_that_exist(store_with_job):
    before = tree(store_with_job)
    for argv in (("ckpt", "ls", store_with_job, "-j", "rnu"), ("ckpt", "verify", store_with_job, "-j", "rnu"),
                 ("ckpt", "show", store_with_job, "-j", "rnu")):
        proc = cli(*argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert "NotFoundError" in proc.stderr and "'rnu'" in proc.stderr and "run" in proc.stderr.replace(
            "'rnu'", ""), proc.stderr
    assert tree(store_with_job) == before


def test_verify_of_nothing_fails(store_with_job):
    proc = cli("ckpt", "verify", store_with_job, "-j", "run", "--step", "7")
    assert proc.returncode != 0 and "NotFoundError" in proc.stderr, (proc.stdout, proc.stderr)
    ok = cli("ckpt", "verify", store_with_job, "-j", "run")
    assert ok.returncode == 0 and "step 1" in ok.stdout, ok.stderr


def test_empty_store_says_what_it_holds(tmp_path):
    root = tmp_path / "other"
    open_store(str(root)).put("datasets/web/x.json", b"{}")
    for argv in (("ckpt", "ls", str(root)), ("ckpt", "models", str(root))):
        proc = cli(*argv)
        assert proc.returncode == 2 and "NotFoundError" in proc.stderr, (argv, proc.stdout, proc.stderr)
        assert "datasets/" in proc.stderr, proc.stderr
    proc = cli("ckpt", "models", str(root), "--model", "llm")
    assert proc.returncode == 2 and "'llm'" in proc.stderr, proc.stderr
