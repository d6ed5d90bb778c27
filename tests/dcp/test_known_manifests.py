"""KnownManifests: incremental DCP saves do not re-read the manifests this process committed,
and a full checkpoint committed again under a reused step number (a rerun) is never diffed
against the one it replaced."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.dcp import StorageReader, StorageWriter
from trainstore.dcp.coordination import KnownManifests
from trainstore.lifecycle.deletion import delete_checkpoint
from trainstore.store import open_store

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::UserWarning")]
SMALL = WriteOptions(chunk_bytes=4096, workers=2, pack_below=0)


def state(seed: int) -> dict:
    return {"w": torch.randn(64, 33, generator=torch.Generator().manual_seed(seed))}


def save(root: str, step: int, sd: dict, kind: str, known: KnownManifests) -> None:
    dcp.save(sd, storage_writer=StorageWriter(root, "j", kind=kind, options=SMALL, known=known),
             checkpoint_id=step, no_dist=True)


def load(root: str, step: int) -> torch.Tensor:
    out = {"w": torch.zeros(64, 33)}
    dcp.load(out, storage_reader=StorageReader(root, "j", step), no_dist=True)
    return out["w"]


def test_incrementals_read_no_manifest_the_saving_process_committed(tmp_path, monkeypatch):
    root, known = str(tmp_path), KnownManifests()
    reads: list[int] = []
    real = mf.load_manifest
    monkeypatch.setattr(mf, "load_manifest", lambda store, job, step, **kw: (reads.append(step),
                                                                              real(store, job, step, **kw))[1])
    save(root, 1, state(1), "full", known)
    for step in (2, 3, 4):
        save(root, step, state(step), "incremental", known)
    assert reads == []  # neither the base search nor the writer re-read step 1..3
    m = real(open_store(root), "j", 4)
    assert m.kind == "incremental" and m.base_step == 1
    assert torch.equal(load(root, 4), state(4)["w"])


def test_a_rerun_full_under_the_same_step_replaces_the_held_base(tmp_path):
    root = str(tmp_path)
    store = open_store(root)
    other_rank = KnownManifests()  # a rank that read step 1 as a base but never commits
    save(root, 1, state(1), "full", KnownManifests())
    assert other_rank.load_full(store, "j", 1).step == 1
    delete_checkpoint(store, "j", 1)  # a rollback; the rerun commits a different full at step 1
    save(root, 1, state(11), "full", KnownManifests())
    other_rank.committed(1, "full")  # what the rank learns from dcp.save's broadcast
    assert other_rank.full(1) is None
    fresh = other_rank.load_full(store, "j", 1)
    assert fresh.tensors == mf.load_manifest(store, "j", 1).tensors
    save(root, 2, state(12), "incremental", other_rank)
    assert torch.equal(load(root, 2), state(12)["w"])


def test_the_base_search_skips_known_incrementals_and_takes_listed_steps_only(tmp_path):
    root, known = str(tmp_path), KnownManifests()
    store = open_store(root)
    save(root, 1, state(1), "full", known)
    save(root, 2, state(2), "incremental", known)
    assert known.kind(2) == "incremental" and known.full(1) is not None
    delete_checkpoint(store, "j", 1)  # the base is gone: not taken from memory
    save(root, 3, state(3), "incremental", known)  # no base listed: saved as a full one
    assert mf.load_manifest(store, "j", 3).kind == "full"
    assert torch.equal(load(root, 3), state(3)["w"])
