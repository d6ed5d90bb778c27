"""The test harness itself (tests/harness): the counting store view, the environment that
lets child processes (crash children, ranks) import ``harness``, and ``run_ranks`` with both
ways of starting ranks (fresh interpreters, and forks of the pre-imported zygote)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from harness import TESTS_DIR, child_env, module_command
from harness.counting import CountingStore
from harness.dist import run_ranks

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


# -- harness.dist: ranks started as fresh interpreters (Popen) and forked from the zygote ----
@pytest.mark.parametrize("fork", [False, True], ids=["popen", "zygote"])
def test_ranks_see_their_own_environment_cwd_and_path_and_talk_over_gloo(tmp_path, monkeypatch, fork):
    monkeypatch.chdir(tmp_path)
    res = run_ranks("harness_rank_workers:describe", 3, {}, env={"HARNESS_PROBE": f"probe-{fork}"},
                    pythonpath=[str(tmp_path)], fork=fork, timeout_s=90)
    assert all(r.ok for r in res), [(r.returncode, r.error, r.stderr[-800:]) for r in res]
    vals = [r.value for r in res]
    assert [v["rank"] for v in vals] == [0, 1, 2] and {v["sum"] for v in vals} == {6}
    assert {v["env"] for v in vals} == {f"probe-{fork}"} and {v["omp"] for v in vals} == {"1"}
    assert {v["cwd"] for v in vals} == {str(tmp_path)} and {v["path0"] for v in vals} == {str(tmp_path)}
    assert len({v["pid"] for v in vals}) == 3 and os.getpid() not in {v["pid"] for v in vals}
    assert len({v["np"] for v in vals}) == 3  # numpy's global generator is not shared by forked ranks
    assert {v["stdout"] for v in vals} == {os.devnull}  # not the zygote's protocol pipe


@pytest.mark.parametrize("fork", [False, True], ids=["popen", "zygote"])
def test_a_sigkilled_rank_reports_minus_9_and_its_stderr(fork):
    res = run_ranks("harness_rank_workers:kill_one", 2, {"victim": 1}, fork=fork, timeout_s=90)
    assert res[0].ok and res[0].value == {"rank": 0}
    assert res[1].returncode == -9 and res[1].value is None and "about to be killed" in res[1].stderr


@pytest.mark.parametrize("fork", [False, True], ids=["popen", "zygote"])
def test_a_rank_past_the_timeout_is_killed_and_a_raised_error_is_reported(fork):
    t = time.monotonic()
    res = run_ranks("harness_rank_workers:hang", 2, {}, fork=fork, timeout_s=5)
    assert res[1].returncode is None and res[1].value is None and time.monotonic() - t < 30  # killed, not waited for
    res = run_ranks("harness_rank_workers:fail", 2, {}, fork=fork, timeout_s=90)
    assert res[0].returncode == 1 and res[0].error == "ValueError: rank 0 says no" and res[0].error_type == "ValueError"
    assert "rank 0 says no" in res[0].stderr and res[1].ok
