"""Errors that say what to do (issue 29 item 6): re-saving a step, opening a file as a dataset,
a wrong endpoint port, missing credentials from the CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from trainstore import CheckpointManager
from trainstore.data import Dataset
from trainstore.errors import AlreadyExistsError, ConfigError


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainstore", *args], capture_output=True, text=True, timeout=120,
                          env={**(env if env is not None else os.environ), "COLUMNS": "80"})


def test_resaving_a_step_says_how_to_continue(tmp_path):
    with CheckpointManager(str(tmp_path / "s"), "run") as mgr:
        mgr.save(1, {"w": torch.ones(2)}, blocking=True)
        with pytest.raises(AlreadyExistsError) as err:
            mgr.save(1, {"w": torch.ones(2)}, blocking=True)
    msg = str(err.value)
    assert "step 1" in msg and "restore" in msg and "new job name" in msg and "later step" in msg, msg


def test_dataset_open_of_a_file_says_pass_its_folder(tmp_path):
    folder = tmp_path / "parquet"
    folder.mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), folder / "part-0.parquet")
    with pytest.raises(ConfigError) as err:
        Dataset.open(str(folder / "part-0.parquet"))
    msg = str(err.value)
    assert "folder" in msg and str(folder) in msg.replace(str(folder / "part-0.parquet"), ""), msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wrong_endpoint_port_says_connection_refused():
    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    proc = cli("store", "ls", "s3://bucket/p", "--endpoint", f"http://127.0.0.1:{port}", env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = " ".join(proc.stderr.split())
    assert f"connection refused at http://127.0.0.1:{port}" in err and "--endpoint" in err, err
    assert "Generic S3 error" not in err, err


def test_cli_credentials_error_names_environment_not_keywords():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = cli("ckpt", "ls", "s3://bucket/p", "--endpoint", "http://127.0.0.1:9", env=env)
    assert proc.returncode == 2 and "CredentialsError" in proc.stderr, (proc.stdout, proc.stderr)
    err = " ".join(proc.stderr.split())
    assert "AWS_ACCESS_KEY_ID" in err and "AWS_SECRET_ACCESS_KEY" in err, err
    assert "access_key_id=" not in err and "skip_signature=True" not in err, err
