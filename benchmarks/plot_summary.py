"""Draw the plots of docs/performance.md from benchmarks/results/headline.json (no benchmark
is run): ``python benchmarks/plot_summary.py [--json FILE] [--out DIR]``. Writes three SVG files:
checkpoint_save.svg, loader.svg, integrations.svg."""

from __future__ import annotations

import argparse
import json
import os

from trainstore.demo.svg import grouped_bars

HERE = os.path.dirname(os.path.abspath(__file__))


def plots(fig: dict) -> dict[str, str]:
    ck, ld, it = fig["checkpoint_save"], fig["loader"], fig["integrations"]
    return {
        "checkpoint_save.svg": grouped_bars(
            "perf-checkpoint", f"Checkpoint save, {ck['section'].split(': ', 1)[1]} (lower is better)",
            ck["methods"], [("caller blocked", ck["blocking"]), ("until durable", ck["durable"])], "seconds",
            xlabel=ck["run"], fmt=lambda v: f"{v:.2f} s", show_values=True),
        "loader.svg": grouped_bars(
            "perf-loader", "Loader: compute per batch needed for >= 90% accelerator use (lower is better)",
            ld["workloads"], list(ld["systems"].items()), ld["unit"],
            xlabel=ld["run"], fmt=lambda v: f"{v:.1f}", show_values=True),
        "integrations.svg": grouped_bars(
            "perf-integrations", "Blocking per save in the frameworks (lower is better)", it["frameworks"],
            list(it["systems"].items()), it["unit"], xlabel="CPU, docs/benchmarks.md 'Integrations' sections",
            fmt=lambda v: f"{v:.1f} ms", show_values=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=os.path.join(HERE, "results", "headline.json"))
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "perf"))
    args = parser.parse_args()
    with open(args.json, encoding="utf-8") as f:
        fig = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    for name, svg in plots(fig).items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write('<?xml version="1.0" encoding="utf-8"?>\n' + svg + "\n")
        print(os.path.join(args.out, name))


if __name__ == "__main__":
    main()
