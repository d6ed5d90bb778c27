"""What a fresh process imports: blosc2 (0.15-0.25 s: it pulls in httpx and rich) only with the
checkpoint manager (whose full saves use shuffle-lz4 by default: the import must not land on a
first save's or a restore's clock) or when a shuffle-lz4 chunk is encoded or decoded; never for
the CLI's start-up, the data loader, trainstore.dcp or chunks in other codecs (``codecs._blosc``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)


def _run(code: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()


def test_blosc2_is_imported_by_the_manager_or_a_chunk_that_needs_it_only():
    out = _run("""
        import sys
        import numpy as np
        import trainstore.cli.main, trainstore.data, trainstore.dcp, trainstore.checkpoint.format.manifest
        from trainstore.codecs import decode, encode
        print("modules", "blosc2" in sys.modules)
        data = memoryview(np.arange(1 << 14, dtype=np.float32)).cast("B")
        for codec in ("raw", "zstd", "shuffle-zstd", "bytegroup-zstd"):
            assert bytes(decode(encode(data, codec, 4), codec, data.nbytes, key="k")) == bytes(data)
        print("other codecs", "blosc2" in sys.modules)
        assert bytes(decode(encode(data, "shuffle-lz4", 4), "shuffle-lz4", data.nbytes, key="k")) == bytes(data)
        print("shuffle-lz4", "blosc2" in sys.modules)
    """)
    assert out == ["modules False", "other codecs False", "shuffle-lz4 True"]
    assert _run("""
        import sys
        from trainstore.checkpoint import CheckpointManager
        print("blosc2" in sys.modules)
    """) == ["True"]
