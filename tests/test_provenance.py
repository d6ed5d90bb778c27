"""Two names for two meanings: ``trainstore_version`` (this library) and ``code_version``
(the git state of the user's working directory), recorded by checkpoints and dataset
versions and shown by the CLI; old manifests that only have ``code_version`` still read."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from trainstore import __version__, provenance
from trainstore.checkpoint import CheckpointManager
from trainstore.cli.main import app
from trainstore.data.ingest import IngestConfig, Ingestor
from trainstore.data.versions import DatasetVersion, load_version, versions_prefix
from trainstore.provenance import code_version, trainstore_version
from trainstore.store import open_store


def _git(cwd, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def user_repo(tmp_path, monkeypatch):
    """A user's project: a git work tree with one commit, the current directory."""
    repo = tmp_path / "project"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("print('train')\n")
    _git(repo, "add", "train.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.chdir(repo)
    return repo


def test_code_version_is_the_git_state_of_the_given_directory(user_repo, tmp_path):
    sha = _git(user_repo, "rev-parse", "HEAD")
    assert code_version() == f"git:{sha}"
    assert code_version(str(user_repo)) == f"git:{sha}"
    (user_repo / "train.py").write_text("print('changed')\n")
    assert code_version() == f"git:{sha}-dirty"
    outside = tmp_path / "not-a-repo"
    outside.mkdir()
    assert code_version(str(outside)) is None
    empty = tmp_path / "no-commit-yet"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert code_version(str(empty)) is None


def test_trainstore_version_names_this_library():
    v = trainstore_version()
    assert v.startswith("git:") or v == f"trainstore {__version__}"


def test_checkpoint_records_both_and_the_cli_shows_both(user_repo, tmp_path):
    root = str(tmp_path / "ckpt")
    with CheckpointManager(root, job="j") as mgr:
        mgr.save(1, {"w": np.arange(8, dtype=np.float32)}, blocking=True)
        meta = mgr.manifest(1).metadata
        info = mgr.list()[0]
    user = f"git:{_git(user_repo, 'rev-parse', 'HEAD')}"
    assert meta["code_version"] == user and info.code_version == user
    assert meta["trainstore_version"] == trainstore_version() == info.trainstore_version
    r = CliRunner().invoke(app, ["ckpt", "show", root, "--job", "j"])
    assert r.exit_code == 0, r.output
    assert f"code {user}" in r.stdout and f"trainstore {trainstore_version()}" in r.stdout


def test_a_slow_git_costs_neither_the_manager_nor_a_restore_and_saves_still_record_it(user_repo, tmp_path,
                                                                                       monkeypatch):
    """``git status`` in a large work tree takes seconds: the manager asks git on its save
    thread, so constructing it (every rank, every restart) and restoring never wait for git,
    and the first save's manifest still names the code."""
    root = str(tmp_path / "ckpt")
    with CheckpointManager(root, job="j") as mgr:
        mgr.save(1, {"w": np.arange(8, dtype=np.float32)}, blocking=True)
    real = provenance._git

    def slow_git(args, cwd):
        time.sleep(0.5)
        return real(args, cwd)

    monkeypatch.setattr(provenance, "_git", slow_git)
    t = time.perf_counter()
    mgr = CheckpointManager(root, job="j")
    state = mgr.restore()
    waited = time.perf_counter() - t
    try:
        assert waited < 0.4, f"constructing a manager and restoring waited {waited:.2f} s for git"
        np.testing.assert_array_equal(state["w"], np.arange(8, dtype=np.float32))
        mgr.save(2, state, blocking=True)
        assert mgr.manifest(2).metadata["code_version"] == f"git:{_git(user_repo, 'rev-parse', 'HEAD')}"
    finally:
        mgr.close()


def test_dataset_version_records_both_and_the_cli_shows_both(user_repo, tmp_path):
    store = open_store(str(tmp_path / "ds"))
    with Ingestor(store, "raw", config=IngestConfig(wal_dir=str(tmp_path / "wal"))) as ing:
        ing.write([{"a": 1}, {"a": 2}])
        made = ing.commit()
    user = f"git:{_git(user_repo, 'rev-parse', 'HEAD')}"
    [meta] = list(store.list(versions_prefix("raw")))
    stored = json.loads(bytes(store.get(meta.key)))
    assert stored["code_version"] == user and stored["trainstore_version"] == trainstore_version()
    loaded = load_version(store, "raw", made.version)
    assert loaded.code_version == user and loaded.trainstore_version == trainstore_version()
    r = CliRunner().invoke(app, ["data", "show", str(tmp_path / "ds"), "raw@1"])
    assert r.exit_code == 0, r.output
    assert f"code {user}" in r.stdout and f"trainstore {trainstore_version()}" in r.stdout


def test_old_dataset_manifest_code_version_was_the_trainstore_version(tmp_path):
    store = open_store(str(tmp_path / "ds"))
    with Ingestor(store, "raw", config=IngestConfig(wal_dir=str(tmp_path / "wal"))) as ing:
        ing.write([{"a": 1}])
        made = ing.commit()
    old = made.to_json()
    del old["trainstore_version"]
    old["code_version"] = "git:v0.0.9-3-gabc"  # before the split it named trainstore's checkout
    back = DatasetVersion.from_json(old)
    assert back.trainstore_version == "git:v0.0.9-3-gabc" and back.code_version is None
