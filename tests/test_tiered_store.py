"""TieredStore specifics beyond the shared suite: the commit of a write-through tiered store
is the durable tier's conditional create (atomic across nodes that share the durable tier),
hot is a cache of it, and a failed hot fill never leaves an older copy to be read."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from trainstore import open_store
from trainstore.errors import AlreadyExistsError
from trainstore.store import TieredStore


def _nodes(tmp_path, n: int, durable_url: str, **opts) -> list[TieredStore]:
    """``n`` tiered stores with their own hot directory (one per node) over one durable tier."""
    return [TieredStore(open_store(str(tmp_path / f"hot{i}")), open_store(durable_url, **opts)) for i in range(n)]


def test_put_if_absent_is_atomic_across_nodes(tmp_path):
    a, b = _nodes(tmp_path, 2, f"memory://{uuid.uuid4().hex}")
    a.put_if_absent("job/manifest.json", b"node a")
    with pytest.raises(AlreadyExistsError):
        b.put_if_absent("job/manifest.json", b"node b")
    assert bytes(a.durable.get("job/manifest.json")) == b"node a"
    assert bytes(b.get("job/manifest.json")) == b"node a"  # b's reads see the committed object
    assert not b.hot.exists("job/manifest.json")


def test_put_if_absent_race_across_nodes_on_s3(tmp_path, s3_url):
    """Eight nodes (own hot tier each) race one commit on S3: exactly one wins, and every
    hot copy that exists is the winner's."""
    url, opts = s3_url
    nodes = _nodes(tmp_path, 8, url, **opts)
    barrier = threading.Barrier(len(nodes))
    winners, losers = [], []

    def commit(i: int) -> None:
        barrier.wait()
        try:
            nodes[i].put_if_absent("race/manifest.json", f"node-{i}".encode())
            winners.append(i)
        except AlreadyExistsError as exc:
            losers.append(exc)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(winners) == 1 and len(losers) == len(nodes) - 1, (winners, losers)
    won = f"node-{winners[0]}".encode()
    assert bytes(nodes[0].durable.get("race/manifest.json")) == won
    for node in nodes:
        assert bytes(node.get("race/manifest.json")) == won
        if node.hot.exists("race/manifest.json"):
            assert bytes(node.hot.get("race/manifest.json")) == won
    assert nodes[winners[0]].hot.exists("race/manifest.json")  # the winner cached its commit


def test_write_through_puts_land_in_durable_and_hot(tmp_path):
    (node,) = _nodes(tmp_path, 1, f"memory://{uuid.uuid4().hex}")
    node.put("k", b"v1")
    node.put("k", b"v2")
    assert bytes(node.durable.get("k")) == b"v2" and bytes(node.hot.get("k")) == b"v2"
    node.hot.delete("k")  # evicted from hot: still there, still refused as a commit
    with pytest.raises(AlreadyExistsError):
        node.put_if_absent("k", b"v3")
    assert bytes(node.get("k")) == b"v2"


def test_write_back_commits_in_hot_and_refuses_durable_keys(tmp_path):
    durable = open_store(f"memory://{uuid.uuid4().hex}")
    node = TieredStore(open_store(str(tmp_path / "hot")), durable, write_back=True)
    node.put_if_absent("m", b"hot only")
    assert node.hot.exists("m") and not durable.exists("m")
    durable.put("copied", b"durable")
    with pytest.raises(AlreadyExistsError):
        node.put_if_absent("copied", b"again")


def test_failed_hot_fill_drops_the_older_hot_copy(tmp_path):
    """The hot tier hits a file-size limit (EFBIG -> CapacityError) while caching a new
    version: the durable put stands and reads return the new version, never the old one."""
    code = textwrap.dedent(f"""
        import resource, signal, uuid
        from trainstore import open_store
        from trainstore.store import TieredStore
        node = TieredStore(open_store({str(tmp_path / "hot")!r}), open_store("memory://" + uuid.uuid4().hex))
        node.put("k", b"old")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        node.put("k", b"n" * (2 << 20))
        assert not node.hot.exists("k"), "the older hot copy is still there"
        assert bytes(node.get("k")) == b"n" * (2 << 20)
        node.put_if_absent("big", b"b" * (2 << 20))
        assert bytes(node.get("big")) == b"b" * (2 << 20) and not node.hot.exists("big")
        print("OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-2000:]


def test_chunk_read_through_a_read_only_view_skips_repair(tmp_path):
    """A bad hot copy read through a read-only view: the good durable copy is returned and
    nothing is written (the repair a writable store would do is refused, not raised)."""
    from trainstore.chunks import ChunkStore

    node = TieredStore(open_store(str(tmp_path / "hot")), open_store(f"memory://{uuid.uuid4().hex}"))
    data = bytes(range(256)) * 64
    ref = ChunkStore(node).put(data).ref
    key = ref.key()
    node.hot.put(key, b"\x00" * len(bytes(node.hot.get(key))))  # bit rot in the hot copy
    got = ChunkStore(node.with_read_only()).get(ref)
    assert bytes(got) == data
    assert bytes(node.hot.get(key)) == b"\x00" * len(bytes(node.durable.get(key)))  # not repaired
