"""The Ray engine: refuses a local-directory store on a multi-node cluster, starts and stops
only the Ray it started, and a failed or cancelled run publishes nothing and resumes."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import require  # tests/conftest.py: optional dependencies

from trainstore.data.transforms import TransformConfig, transform
from trainstore.data.transforms.engines import check_ray_store
from trainstore.data.versions import list_versions
from trainstore.errors import ConfigError, TrainstoreError, TransformError

from .xf_support import ROWS, SHARDS, column, small_dataset


def _node(alive=True):
    return {"NodeID": os.urandom(4).hex(), "Alive": alive}


def test_local_store_is_refused_on_a_multi_node_cluster_unless_declared_shared():
    url = "file:///data/store"
    with pytest.raises(ConfigError, match="cluster of 2 nodes cannot use the local store file:///data/store") as err:
        check_ray_store(url, [_node(), _node()], store_shared=False)
    assert isinstance(err.value, TrainstoreError)
    check_ray_store(url, [_node(), _node(alive=False)], store_shared=False)  # one live node
    check_ray_store(url, [_node()], store_shared=False)
    check_ray_store(url, [_node(), _node(), _node()], store_shared=True)  # e.g. NFS on every node
    check_ray_store("s3://bucket/prefix", [_node(), _node()], store_shared=False)


def _fails_while(flag: str):
    """A closure (shipped to Ray with cloudpickle) that fails on ids >= 60 while ``flag`` exists."""
    def fn(batch):
        if os.path.exists(flag) and pc.max(batch.column("id")).as_py() >= 60:
            raise ValueError("flagged")
        return pa.RecordBatch.from_arrays([pc.multiply(batch.column("id"), 2)], names=["y"])
    return fn


class _Cancel(BaseException):
    """Stands in for KeyboardInterrupt (which pytest would treat as a request to stop)."""


@pytest.mark.timeout(240)
def test_ray_engine_starts_and_stops_its_own_ray_and_a_cancel_publishes_nothing(tmp_path):
    ray = require("ray", install="pip install 'trainstore[ray]'")
    assert not ray.is_initialized()
    store = small_dataset(tmp_path)
    calls = []

    def cancel_after_first_shard(done, total):
        calls.append(done)
        if done >= 1:
            raise _Cancel

    cfg = TransformConfig(engine="ray", workers=1)
    with pytest.raises(_Cancel):
        transform(store, "nums", _fails_while(str(tmp_path / "no-flag")), output="r", config=cfg,
                  progress=cancel_after_first_shard)
    assert not ray.is_initialized(), "the engine must shut down the Ray it started"
    assert list_versions(store, "r") == [] and calls == [0, 1]
    done = transform(store, "nums", _fails_while(str(tmp_path / "no-flag")), output="r")  # local
    assert done.extra["resumed_shards"] >= 1
    assert column(store, done, "y") == [2 * i for i in range(ROWS)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_engine_keeps_the_callers_ray_and_a_failed_task_publishes_nothing_then_resumes(tmp_path):
    ray = require("ray", install="pip install 'trainstore[ray]'")
    store = small_dataset(tmp_path)
    flag = tmp_path / "flag"
    flag.write_text("fail")
    cfg = TransformConfig(engine="ray", workers=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(TransformError, match=r"failed on shard \S+ rows \d+-\d+: ValueError: flagged"):
            transform(store, "nums", _fails_while(str(flag)), output="r", config=cfg)
        assert list_versions(store, "r") == []
        assert ray.is_initialized(), "the engine must not shut down a Ray it did not start"
        flag.unlink()
        done = transform(store, "nums", _fails_while(str(flag)), output="r", config=cfg)
        assert ray.is_initialized() and len(ray.nodes()) == 1
    finally:
        ray.shutdown()
    assert 0 < done.extra["resumed_shards"] < SHARDS  # shards before id 60 were kept
    assert column(store, done, "y") == [2 * i for i in range(ROWS)]
    assert done.extra["engine"] == "ray" and list_versions(store, "r") == [1]
