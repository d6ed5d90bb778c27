"""The test harness itself (tests/harness): the counting store view, and the environment that
lets child processes (crash children, ranks) import ``harness``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import TESTS_DIR, child_env, module_command
from harness.counting import CountingStore

from trainstore.errors import ReadOnlyError
from trainstore.store import LocalStore


def test_counting_store_counts_every_byte_its_reads_return(tmp_path):
    inner = LocalStore(str(tmp_path))
    inner.put("a", b"x" * 1000)
    store = CountingStore(inner)
    assert bytes(store.get("a")) == b"x" * 1000
    assert bytes(store.get_range("a", 10, 90)) == b"x" * 90
    assert [len(b) for b in store.get_ranges("a", [(0, 5), (100, 7)])] == [5, 7]
    assert store.bytes_read == 1000 + 90 + 5 + 7
    store.head("a")
    assert store.bytes_read == 1102  # metadata is not object bytes
    with pytest.raises(ReadOnlyError, match="'b'"):
        store.put("b", b"y")
    assert not inner.exists("b")


def test_child_env_lets_a_child_started_elsewhere_import_the_harness(tmp_path):
    code = "import harness.dist, sys; print(harness.dist.__file__)"
    bare = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    # the child does not see tests/ by itself (cwd elsewhere, no PYTHONPATH) ...
    without = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=bare, capture_output=True, text=True)
    assert without.returncode != 0 and "No module named 'harness'" in without.stderr
    # ... child_env puts tests/ first on PYTHONPATH, keeping what was there
    env = child_env({**bare, "PYTHONPATH": str(tmp_path)})
    assert env["PYTHONPATH"].split(os.pathsep) == [TESTS_DIR, str(tmp_path)]
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{TESTS_DIR}/harness/dist.py"


def test_module_command_runs_a_harness_module_as_a_script(tmp_path):
    res = subprocess.run(module_command("trainjob", "nonsense"), cwd=tmp_path, env=child_env(),
                         capture_output=True, text=True, timeout=60)
    # trainjob's own usage error: the module ran as __main__ from the harness package
    assert res.returncode != 0 and "usage: python -m harness.trainjob" in res.stderr, res.stderr
