"""What the demo report says is true (issue 29 item 4): bad checkpoints marked in the checkpoint
table and in retention, metrics rounded, lineage labels whole, the codecs really used named, and
no self-check text for readers. (The page is rendered in Chromium by test_report_browser.py.)"""

from __future__ import annotations

import re

from trainstore.demo.context import RUN_FORMAT
from trainstore.demo.report import render_html

LONG = "tickets.clean.features.train.with-a-long-name@12"


def _record() -> dict:
    steps = [{"step": i, "compute_s": 0.01, "wait_s": 0.001, "ckpt_s": 0.0} for i in range(1, 31)]
    cks = [{"step": s, "kind": k, "base_step": b, "logical_bytes": 1 << 20, "stored_bytes": 1 << 19,
            "written_bytes": 1 << 19, "blocked_s": 0.002, "metrics": {"val_loss": 0.367512345678912, "val_acc": 0.5}}
           for s, k, b in ((10, "full", None), (20, "incremental", 10), (30, "full", None))]
    return {
        "format": RUN_FORMAT, "store": "file:///tmp/x", "config": {"size": "small"},
        "train": {"steps": steps, "checkpoints": cks, "params": 1000, "done": {"loader": {"wait_fraction": 0.1, "cache_hit_rate": 0.5}},
                  "baseline": {"torch_save_s": 0.01, "torch_save_bytes": 1 << 20}},
        "storage": {"tiers": [["durable (store)", [["checkpoint chunks", 3 << 19]]]],
                    "codecs": {"zstd-bytegroup": 3 << 18, "raw": 1 << 10}},
        "lineage": {"nodes": [{"id": "a", "label": "tickets@1", "kind": "dataset", "detail": "10 rows"},
                              {"id": "b", "label": LONG, "kind": "features", "detail": "10 rows · 1 KiB"}],
                    "edges": [["a", "b"]]},
        "lifecycle": {"verify": {"checked": 3, "bad": [20]},
                      "retention": {"decisions": [
                          {"step": 10, "kind": "full", "keep": True, "reasons": ["best #1 by val_loss=0.3675 (min)"]},
                          {"step": 20, "kind": "incremental", "keep": False, "reasons": ["not among the last 1"]},
                          {"step": 30, "kind": "full", "keep": True, "reasons": ["among the last 1"]}]}},
    }


def _row(html: str, table_after: str, step: int) -> str:
    part = html[html.index(table_after):]
    m = re.search(rf"<tr[^>]*><td[^>]*>{step}</td>.*?</tr>", part)
    assert m, (step, part[:2000])
    return m.group(0)


def test_report_marks_bad_rounds_and_cuts_nothing():
    html = render_html(_record())
    assert 'class="bad"' in _row(html, "val loss", 20) and "bad" in _row(html, "val loss", 20)
    assert "bad" not in _row(html, "val loss", 10)
    assert "bad" in _row(html, "Retention decisions", 20)
    assert "0.3675" in html and "0.36751" not in html
    assert LONG in re.sub(r"<[^>]+>", "", html[html.index('id="plot-lineage"'):]), "lineage label cut"
    assert "\u2026" not in html[html.index('id="plot-lineage"'):]
    assert "zstd-bytegroup" in html and "shuffle + zstd" not in html
    assert "scripts off" not in html and "not checked" not in html


def test_regenerate_hint_carries_the_endpoint():
    from trainstore.demo.pipeline import report_command

    cmd = report_command("s3://b/demo", {"endpoint": "http://127.0.0.1:9000", "allow_http": True}, "/tmp/r.html")
    assert cmd == ("trainstore report --store s3://b/demo --endpoint http://127.0.0.1:9000 --allow-http "
                   "--out /tmp/r.html")
    assert report_command("./.demo/store", {}, "r.html") == "trainstore report --store ./.demo/store --out r.html"
