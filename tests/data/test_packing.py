"""Sequence packing: every token once per epoch, document boundaries, cu_seqlens, determinism,
resume mid-epoch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset
from trainstore.data.serve.packing import PackedLoader, PackingConfig, block_attention_mask
from trainstore.errors import ConfigError, SchemaError

pytestmark = pytest.mark.timeout(120)

SEQ, DOCS, STRIDE = 32, 150, 1000  # token = doc * STRIDE + position in doc: says where it came from


@pytest.fixture
def ds(tmp_path):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 80, DOCS)  # many longer than SEQ
    lengths[5] = SEQ  # exactly one sequence
    tokens = [(d * STRIDE + np.arange(n)).astype(np.int32) for d, n in enumerate(lengths)]
    table = pa.table({"doc": np.arange(DOCS), "tokens": pa.array([t.tolist() for t in tokens], pa.list_(pa.int32()))})
    store = open_store(str(tmp_path / "durable"))
    write_arrow_dataset(store, "docs", table, 40)
    ds = Dataset(store, "docs@1", cache_dir=tmp_path / "hot")
    ds.lengths = lengths
    return ds


def packed(ds, mode="concat", split_docs=True, seed=1, batch=4, docs_per_window=16):
    loader = Loader(ds, batch_size=docs_per_window, seed=seed, rank=0, world_size=1)
    return PackedLoader(loader, PackingConfig(seq_len=SEQ, batch_size=batch, mode=mode, split_docs=split_docs,
                                              pad_id=-1))


def segments(batch):
    """(sequence, start, stop) of each run of one doc_id > 0."""
    out = []
    for b, ids in enumerate(batch["doc_ids"]):
        edges = np.flatnonzero(np.diff(ids)) + 1
        for s, e in zip(np.r_[0, edges], np.r_[edges, len(ids)]):
            if ids[s] > 0:
                out.append((b, int(s), int(e)))
    return out


MODES = [("concat", True), ("concat", False), ("first-fit", True)]


@pytest.mark.parametrize(("mode", "split"), MODES)
def test_every_token_once_and_boundaries(ds, mode, split):
    seen = []
    for batch in packed(ds, mode, split):
        ids, pos, tok = batch["input_ids"], batch["position_ids"], batch["doc_ids"]
        assert ids.shape[1] == SEQ and ids.shape == pos.shape == tok.shape
        assert (ids[tok == 0] == -1).all() and (pos[tok == 0] == 0).all()  # padding
        for b, s, e in segments(batch):
            piece = ids[b, s:e]
            doc, first = divmod(int(piece[0]), STRIDE)
            # one piece = consecutive tokens of one document, positions restarting at 0
            assert piece.tolist() == list(range(piece[0], piece[0] + (e - s)))
            assert pos[b, s:e].tolist() == list(range(e - s))
            if mode != "concat" or not split:  # cut only at multiples of seq_len (long documents)
                assert first % SEQ == 0 and (e - s == SEQ or first + (e - s) == ds.lengths[doc])
        # cu_seqlens: every run boundary of the flattened batch (padding runs included)
        flat = np.concatenate([np.r_[0, np.flatnonzero(np.diff(r)) + 1] + i * SEQ
                               for i, r in enumerate(tok)] + [[tok.size]])
        assert batch["cu_seqlens"].tolist() == flat.tolist()
        assert batch["max_seqlen"] == np.diff(flat).max()
        seen.append(ids[tok > 0])
    seen = np.sort(np.concatenate(seen))
    expected = np.sort(np.concatenate([d * STRIDE + np.arange(n) for d, n in enumerate(ds.lengths)]))
    assert seen.tolist() == expected.tolist()


def test_first_fit_pads_less_than_unsplit_concat(ds):
    def pad(p):
        return sum(int((b["doc_ids"] == 0).sum()) for b in p)
    assert pad(packed(ds, "first-fit")) < pad(packed(ds, "concat", split_docs=False))


def test_block_attention_mask():
    doc_ids = np.array([[1, 1, 2, 2, 0]])
    m = block_attention_mask(doc_ids)[0]
    assert m.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]]


@pytest.mark.parametrize(("mode", "split"), MODES)
@pytest.mark.parametrize("stop", [1, 3, 7])
def test_deterministic_and_resume_mid_epoch(ds, mode, split, stop):
    full = [b["input_ids"].tolist() for b in packed(ds, mode, split)]
    assert full == [b["input_ids"].tolist() for b in packed(ds, mode, split)]
    assert full != [b["input_ids"].tolist() for b in packed(ds, mode, split, seed=2)]
    p = packed(ds, mode, split)
    first = []
    for b in p:
        first.append(b["input_ids"].tolist())
        if len(first) == stop:
            break
    state = p.state_dict()
    assert state["loader"]["epoch"] == 0
    q = packed(ds, mode, split)
    q.load_state_dict(state)
    rest = [b["input_ids"].tolist() for b in q]
    assert first + rest == full
    # the next epoch continues normally after the resumed one
    assert [b["input_ids"].tolist() for b in q] == [b["input_ids"].tolist() for b in _epoch(ds, mode, split, 1)]


def _epoch(ds, mode, split, epoch):
    p = packed(ds, mode, split)
    p.loader.set_epoch(epoch)
    return list(p)


def test_refusals(ds):
    with pytest.raises(ConfigError):
        PackingConfig(seq_len=0)
    with pytest.raises(ConfigError):
        PackingConfig(seq_len=8, mode="best")
    loader = Loader(ds, batch_size=8, rank=0, world_size=1)
    with pytest.raises(SchemaError, match="no column 'text'"):
        PackedLoader(loader, PackingConfig(seq_len=8, column="text"))
    p = PackedLoader(loader, PackingConfig(seq_len=8))
    with pytest.raises(ConfigError, match="other packing settings"):
        p.load_state_dict(dict(PackedLoader(loader, PackingConfig(seq_len=16)).state_dict()))


@pytest.mark.parametrize(("mode", "split"), MODES)
def test_state_right_after_resume_keeps_the_returned_count(ds, mode, split):
    """issue 26 item 2: a state taken after load_state_dict and before the first batch (a
    checkpoint at the resume step, a preemption handler) resumes where the first one did."""
    full = [b["input_ids"].tolist() for b in packed(ds, mode, split)]
    p = packed(ds, mode, split)
    first = []
    for b in p:
        first.append(b["input_ids"].tolist())
        if len(first) == 3:
            break
    state = p.state_dict()
    assert state["skip"] > 0  # stopped inside a window: the case that was lost
    q = packed(ds, mode, split)
    q.load_state_dict(state)
    assert q.state_dict() == state  # nothing served yet: the same resume point
    iter(q)  # an iterator made but not advanced serves nothing either
    again = q.state_dict()
    r = packed(ds, mode, split)
    r.load_state_dict(again)
    assert first + [b["input_ids"].tolist() for b in r] == full
