"""The demo on an object store: ``--store s3://...`` with endpoint options, against the loopback
S3 server; credentials reach the training workers but never the report, record or logs."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_demo_on_s3(s3_url, tmp_path, monkeypatch):
    from trainstore import open_store
    from trainstore.cli.main import app
    from trainstore.demo.report import load_run

    url, opts = s3_url
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", opts["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", opts["secret_access_key"])
    args = ["--endpoint", opts["endpoint"], "--region", opts["region"], "--allow-http"]
    result = CliRunner().invoke(app, ["demo", "--small", "--store", url, *args, "--work-dir", str(tmp_path / "work"),
                                      "--report", str(tmp_path / "report.html")], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    hint = " ".join(result.output.split())  # the regenerate hint names the endpoint the run used
    assert f"trainstore report --store {url} --endpoint {opts['endpoint']}" in hint, result.output
    run = load_run(open_store(url, **opts))
    assert run["crash"]["compare"]["identical"] and run["corruption"]["detected"]
    assert run["lifecycle"]["export"]["matches_checkpoint"] and "stable" in run["lifecycle"]["model"]["aliases"]
    again = tmp_path / "again.html"
    result = CliRunner().invoke(app, ["report", "--store", url, *args, "--out", str(again)])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "report.html").read_text()
    assert again.read_text() == html
    secret = opts["secret_access_key"]
    texts = [html, json.dumps(run), result.output]
    for root, _dirs, files in os.walk(tmp_path / "work"):
        texts += [open(os.path.join(root, f), errors="replace").read() for f in files if f.endswith(".log")]
    assert all(secret not in t for t in texts)
