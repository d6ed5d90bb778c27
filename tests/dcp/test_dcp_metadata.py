"""DCP metadata as JSON (no pickle), checkpoint ids, byte ranges of boxes: single-process tests."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from trainstore.dcp.coordination import parse_checkpoint_id
from trainstore.dcp.metadata import metadata_from_json, metadata_to_json
from trainstore.dcp.reader import _byte_range
from trainstore.errors import ConfigError, ManifestError, UnsupportedTypeError


def sample_metadata() -> Metadata:
    tmd = TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.bfloat16, requires_grad=True),
        size=torch.Size([8, 4]),
        chunks=[ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 4])),
                ChunkStorageMetadata(offsets=torch.Size([4, 0]), sizes=torch.Size([4, 4]))])
    return Metadata(state_dict_metadata={"model.w": tmd, "step": BytesStorageMetadata()},
                    planner_data={"model.w": ("model", "w"), "step": ("step",)},
                    storage_meta=StorageMeta(checkpoint_id="trainstore:x#j@1", save_id="abc"), version="1.0.0")


def test_metadata_json_roundtrip_is_plain_json():
    md = sample_metadata()
    obj = json.loads(json.dumps(metadata_to_json(md)))  # plain JSON, nothing pickled
    back = metadata_from_json(obj)
    assert back.state_dict_metadata == md.state_dict_metadata
    assert back.planner_data == md.planner_data
    assert back.storage_meta.checkpoint_id == "trainstore:x#j@1" and back.version == "1.0.0"


@pytest.mark.parametrize("mutate, match", [
    (lambda o: o["state_dict_metadata"]["model.w"].update(dtype="torch.evil"), "dtype"),
    (lambda o: o["state_dict_metadata"]["model.w"].update(chunks=[[[6, 0], [4, 4]]]), "does not fit"),
    (lambda o: o["state_dict_metadata"]["model.w"].update(size=[-1, 4]), "non-negative"),
    (lambda o: o["state_dict_metadata"]["model.w"].update(layout="os.system"), "layout"),
    (lambda o: o["state_dict_metadata"].update(x={"type": "pickle"}), "tensor|bytes"),
    (lambda o: o.update(format="other"), "not a distributed"),
    (lambda o: o.update(planner_data={"$tensor": "x"}), "tensor"),
])
def test_hostile_metadata_is_a_manifest_error(mutate, match):
    obj = metadata_to_json(sample_metadata())
    mutate(obj)
    with pytest.raises(ManifestError, match=match):
        metadata_from_json(obj)


def test_planner_data_with_tensors_is_rejected():
    md = sample_metadata()
    md.planner_data = {"x": torch.ones(2)}
    with pytest.raises(UnsupportedTypeError):
        metadata_to_json(md)


def test_checkpoint_ids():
    assert parse_checkpoint_id(12).step == 12
    assert parse_checkpoint_id("run-1@12").job == "run-1"
    t = parse_checkpoint_id("trainstore:s3://b/p#run-1@7")
    assert (t.url, t.job, t.step) == ("s3://b/p", "run-1", 7)
    for bad in ("../x@1", "job@", "/tmp/dir", -1, 10**13):
        with pytest.raises(ConfigError):
            parse_checkpoint_id(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4).flatmap(
    lambda shape: st.tuples(st.just(shape), st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)),
                                                     min_size=len(shape), max_size=len(shape)))))
def test_byte_range_covers_exactly_the_box(case):
    shape, raw = case
    offsets = [min(o, d - 1) for (o, _), d in zip(raw, shape)]
    lengths = [min(n, d - o) for (_, n), o, d in zip(raw, offsets, shape)]
    lo, hi = _byte_range(tuple(shape), offsets, lengths, 4)
    idx = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    box = idx
    for dim, (o, n) in enumerate(zip(offsets, lengths)):
        box = box.narrow(dim, o, n)
    if box.numel() == 0:
        assert hi <= lo
    else:
        assert lo == int(box.min()) * 4 and hi == (int(box.max()) + 1) * 4
