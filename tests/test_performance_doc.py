"""docs/performance.md agrees with benchmarks/results/headline.json, and its plots are what
benchmarks/plot_summary.py draws from that JSON (issue 29 item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..")
FIG = json.load(open(os.path.join(ROOT, "benchmarks", "results", "headline.json"), encoding="utf-8"))
DOC = open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8").read()


def test_plots_are_drawn_from_the_json(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plot_summary.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=120)
    for name in ("checkpoint_save.svg", "loader.svg", "integrations.svg"):
        drawn = (tmp_path / name).read_text(encoding="utf-8")
        assert drawn == open(os.path.join(ROOT, "docs", "perf", name), encoding="utf-8").read(), name
        assert f"perf/{name}" in DOC


def test_headline_ratios_follow_from_the_json():
    ck, ld, it, gpu = FIG["checkpoint_save"], FIG["loader"], FIG["integrations"], FIG["gpu"]
    ts, torch_save, dcp = ck["methods"].index("trainstore"), 0, ck["methods"].index("DCP async_save")
    ratios = [ck["blocking"][ts] / ck["blocking"][torch_save], ck["durable"][ts] / ck["durable"][torch_save]]
    ratios += [ck["blocking"][ts] / ck["blocking"][dcp], ck["durable"][ts] / ck["durable"][dcp]]
    for i in range(2):  # large, medium: against the best peer
        peers = [v[i] for k, v in ld["systems"].items() if not k.startswith("trainstore")]
        ratios.append(ld["systems"]["trainstore (block shuffle)"][i] / min(peers))
    ratios += [it["systems"]["trainstore"][k] / it["systems"]["framework default"][k] for k in range(2)]
    ratios.append(gpu["released"][3] / gpu["released"][2])
    shown = [f"**{r:.3f}x**" if r < 0.06 else f"**{r:.2f}x**" for r in ratios]
    for r, text in zip(ratios, shown):
        assert text in DOC, (r, text)
    assert f"{gpu['durable'][3] / gpu['durable'][2]:.2f}x (worse" in DOC
