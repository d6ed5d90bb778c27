"""CLI output that fits (issue 29 item 3), through the CLI in a subprocess: at 80 columns, piped
or in a terminal, tables never cut paths, steps, kinds or statuses; ``ckpt models NAME`` works as
its help says; the help prints no ``<bool>``; an unknown command suggests the closest one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from trainstore import CheckpointManager, open_store
from trainstore.lifecycle.registry import Registry

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
JOB = "a-rather-long-training-job-name-2026"


def cli(*args: str, terminal: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")}
    env["COLUMNS"] = "80"
    if terminal:
        env["FORCE_COLOR"] = "1"  # rich renders as for a terminal although stdout is a pipe
    proc = subprocess.run([sys.executable, "-m", "trainstore", *args], capture_output=True, text=True,
                          timeout=120, env=env)
    proc.stdout = ANSI.sub("", proc.stdout)
    proc.stderr = ANSI.sub("", proc.stderr)
    return proc


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cli_out") / "a-store-whose-path-is-long" / "enough-to-matter-at-80-cols")
    with CheckpointManager(root, JOB) as mgr:
        for step in (1000, 2000, 123456):
            mgr.save(step, {"w": torch.ones(4)}, metrics={"val_loss": 0.123456789012345, "accuracy": 0.5},
                     blocking=True)
    open_store(root).put("notes/" + "x" * 70 + ".txt", b"1")
    Registry(open_store(root)).register(JOB, 2000, "llm", aliases=("latest",))
    return root


def _whole(out: str, *words: str) -> None:
    assert "\u2026" not in out, out  # rich's ellipsis: a cell was cut
    for w in words:
        assert w in out, (w, out)


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_ckpt_ls_cuts_nothing_at_80_columns(store, terminal):
    runs = {i["run"] for i in json.loads(cli("ckpt", "ls", store, "-j", JOB, "--json").stdout)}
    proc = cli("ckpt", "ls", store, "-j", JOB, terminal=terminal)
    assert proc.returncode == 0, proc.stderr
    _whole(proc.stdout, store, JOB, "1000", "2000", "123456", "full", "unverified", *runs)
    # too wide for 80 columns even in a terminal: plain columns, one line per checkpoint, no box
    rows = [line for line in proc.stdout.splitlines() if line.split()[:1] in (["1000"], ["2000"], ["123456"])]
    assert len(rows) == 3 and all("unverified" in r and "full" in r for r in rows), proc.stdout
    assert not set("┃│┏━") & set(proc.stdout), proc.stdout


def test_a_table_that_fits_a_terminal_keeps_its_box(store):
    proc = cli("ckpt", "models", store, terminal=True)
    assert proc.returncode == 0, proc.stderr
    assert "┃" in proc.stdout and max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout
    _whole(proc.stdout, "llm", "latest=1")


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_store_ls_and_retain_cut_nothing(store, terminal):
    proc = cli("store", "ls", store, "--prefix", "notes/", terminal=terminal)
    assert proc.returncode == 0, proc.stderr
    _whole(proc.stdout, store, "notes/" + "x" * 70 + ".txt")
    proc = cli("ckpt", "retain", store, "-j", JOB, "--keep-last", "1", "--dry-run", terminal=terminal)
    assert proc.returncode == 0, proc.stderr
    _whole(proc.stdout, "would delete", "keep", "123456")


def test_ckpt_models_name_lists_its_versions(store):
    by_name = cli("ckpt", "models", store, "llm", "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert [v["step"] for v in json.loads(by_name.stdout)["versions"]] == [2000]
    assert json.loads(cli("ckpt", "models", store, "-m", "llm", "--json").stdout) == json.loads(by_name.stdout)
    table = cli("ckpt", "models", store, "llm")
    _whole(table.stdout, f"{JOB}@2000", "latest", "val_loss=0.1235")


def test_help_has_no_bool_and_unknown_commands_suggest():
    for argv in (("ckpt", "ls", "--help"), ("data", "ls", "--help"), ("ckpt", "retain", "--help")):
        proc = cli(*argv)
        assert proc.returncode == 0 and "--json" in proc.stdout and "<bool>" not in proc.stdout, proc.stdout
    for argv in (("--help",), ("ckpt", "--help")):  # the groups' own flags (--version, --help)
        proc = cli(*argv)
        assert proc.returncode == 0 and "--help" in proc.stdout and "<bool>" not in proc.stdout, proc.stdout
    proc = cli("ckpt", "inspect", "x")
    assert proc.returncode == 2 and "Did you mean 'show'" in proc.stderr, proc.stderr
    proc = cli("inspect")
    assert proc.returncode == 2 and "Did you mean 'ckpt show'" in proc.stderr, proc.stderr
