"""What a fresh process imports: blosc2 (0.15-0.25 s: it pulls in httpx and rich) only when a
shuffle-lz4 chunk is encoded or decoded, or a save with that codec is staged; never for the
CLI, the data loader, DCP or a restore of chunks in other codecs (``codecs._blosc``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)


def _run(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_library_imports_without_blosc2_until_a_chunk_needs_it(tmp_path):
    out = _run(f"""
        import sys
        import torch
        import trainstore.checkpoint, trainstore.cli.main, trainstore.dcp, trainstore.data
        from trainstore.checkpoint import CheckpointManager
        from trainstore.checkpoint.save.writer import WriteOptions
        print("after import", "blosc2" in sys.modules)
        with CheckpointManager({str(tmp_path / "a")!r}, job="j", options=WriteOptions(codec="shuffle-zstd")) as m:
            m.save(1, {{"w": torch.zeros(1 << 16)}}, blocking=True)
            assert torch.equal(m.restore(1)["w"], torch.zeros(1 << 16))
        print("after a zstd save and restore", "blosc2" in sys.modules)
        from trainstore.codecs import decode, encode
        data = memoryview(torch.zeros(1 << 16).numpy().view("uint8"))
        enc = encode(data, "shuffle-lz4", 4)
        assert bytes(decode(enc, "shuffle-lz4", data.nbytes, key="k")) == bytes(data)
        print("after shuffle-lz4", "blosc2" in sys.modules)
    """)
    assert out.splitlines() == ["after import False", "after a zstd save and restore False", "after shuffle-lz4 True"]


def test_preload_imports_it_on_a_thread_for_shuffle_lz4_only():
    out = _run("""
        import sys, threading
        from trainstore import codecs
        codecs.preload("shuffle-zstd")
        codecs.preload("raw")
        print("blosc2" in sys.modules, [t.name for t in threading.enumerate() if "blosc2" in t.name])
        codecs.preload("shuffle-lz4")
        for t in threading.enumerate():
            if t.name == "trainstore-import-blosc2":
                t.join()
        print("blosc2" in sys.modules)
    """)
    assert out.splitlines() == ["False []", "True"]
