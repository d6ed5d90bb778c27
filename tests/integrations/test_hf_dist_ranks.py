"""Per-rank state (``integrations.ranks``) through a real 2-rank DCP save, loaded on 2, 1 and 3 ranks."""

from __future__ import annotations

from pathlib import Path

from harness.dist import run_ranks

HERE = str(Path(__file__).parent)
W = "hf_dist_ranks_worker"


def _run(fn: str, world: int, store: str) -> list:
    res = run_ranks(f"{W}:{fn}", world=world, args={"store": store}, timeout_s=120, pg_timeout_s=20, pythonpath=[HERE])
    assert all(r.ok for r in res), [(r.error, r.stderr[-1500:]) for r in res]
    return [r.value for r in res]


def test_per_rank_entries_survive_dcp_dedup_and_report_what_cannot_move(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    _run("save", 2, store)
    same = _run("load", 2, store)  # without rank keys DCP would keep one rank's value for both
    assert [v["entry"] for v in same] == [[[0.0] * 3, 0], [[1.0] * 3, 10]]
    assert all(v["moved_all"] for v in same)
    one = _run("load", 1, store)
    assert one[0]["entry"] == [[0.0] * 3, 0] and not one[0]["moved_all"]
    assert "ranks 1..1 is not used" in one[0]["text"]
    three = _run("load", 3, store)
    assert [v["entry"] for v in three[:2]] == [[[0.0] * 3, 0], [[1.0] * 3, 10]]
    assert three[2]["entry"] is None and not three[2]["restored"]
    assert "rank 2 has no saved per-rank state" in three[2]["text"]
