"""How incremental pieces are stored (``WriteOptions.incompressible_ratio``, auto by default):
a writer short of CPU on a local disk keeps an XOR delta only where it halves, and stores the
piece plain (raw) otherwise; with CPU to spare, or a network store, deltas that save 3% stay.
A delta that would be stored raw is never stored: the plain piece is as large and restores
without its base. Unchanged pieces cost nothing either way; every restore is bit-exact."""

from __future__ import annotations

import uuid

import pytest
import torch

from trainstore import open_store
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format.delta import auto_incompressible_ratio
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ConfigError

pytestmark = pytest.mark.timeout(120)
INCR = CheckpointPolicy(full_every=10, incremental_every=1)


def _states() -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(7)
    base = {"moved": torch.randn(1 << 20, generator=g),  # every weight moved a little: delta ~0.75
            "sparse": torch.randn(1 << 20, generator=g),  # 1 in 1000 changed: the delta halves and more
            "frozen": torch.randn(1 << 19, generator=g)}  # unchanged: same as base
    nxt = {k: v.clone() for k, v in base.items()}
    nxt["moved"] += torch.randn(nxt["moved"].shape, generator=g) * 1e-3
    nxt["sparse"][::1000] += 1.0
    return base, nxt


def _kinds(store, **opts) -> dict[str, set[str]]:
    """How each tensor's pieces of the incremental were stored: delta, plain:<codec>, same."""
    base, nxt = _states()
    with CheckpointManager(store, job="j", policy=INCR, options=WriteOptions(pack_below=0, **opts)) as mgr:
        mgr.save(1, base, blocking=True)
        mgr.save(2, nxt, blocking=True)
        m = mgr.manifest(2)
        assert m.kind == "incremental"
        got = mgr.restore(2)
    for k, v in nxt.items():
        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
    out: dict[str, set[str]] = {}
    for k, entry in m.tensors.items():
        for c in entry.chunks:
            kind = "same" if c.same_as_base else ("delta" if c.base is not None else f"plain:{c.ref.codec}")
            out.setdefault(k, set()).add(kind)
    return out


def test_auto_limit_follows_the_cpu_threads_and_the_store():
    assert auto_incompressible_ratio(1, local=True) == auto_incompressible_ratio(3, local=True) == 0.5
    assert auto_incompressible_ratio(4, local=True) == auto_incompressible_ratio(8, local=True) == 0.97
    assert auto_incompressible_ratio(1, local=False) == 0.97


def test_few_cpu_threads_on_a_local_disk_keep_only_deltas_that_halve(tmp_path):
    assert _kinds(str(tmp_path / "s"), cpu_threads=1) == \
        {"moved": {"plain:raw"}, "sparse": {"delta"}, "frozen": {"same"}}


def test_enough_cpu_threads_keep_deltas_that_save_a_few_percent(tmp_path):
    assert _kinds(str(tmp_path / "s"), cpu_threads=4) == \
        {"moved": {"delta"}, "sparse": {"delta"}, "frozen": {"same"}}


def test_a_network_store_keeps_deltas_with_one_thread():
    store = open_store(f"memory://{uuid.uuid4().hex}")
    assert _kinds(store, cpu_threads=1)["moved"] == {"delta"}


def test_an_explicit_limit_wins(tmp_path):
    assert _kinds(str(tmp_path / "a"), cpu_threads=1, incompressible_ratio=0.97)["moved"] == {"delta"}
    assert _kinds(str(tmp_path / "b"), cpu_threads=8, incompressible_ratio=0.3) == \
        {"moved": {"plain:raw"}, "sparse": {"delta"}, "frozen": {"same"}}


def test_a_delta_that_would_be_stored_raw_is_stored_as_the_plain_piece(tmp_path):
    """delta_codec="raw": every delta would be raw, as large as the piece and slower to restore."""
    assert _kinds(str(tmp_path / "s"), cpu_threads=8, delta_codec="raw") == \
        {"moved": {"plain:raw"}, "sparse": {"plain:raw"}, "frozen": {"same"}}


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_a_limit_outside_0_1_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match=f"incompressible_ratio must be in \\(0, 1\\] or None \\(auto\\), got {bad}"):
        WriteOptions(incompressible_ratio=bad)
