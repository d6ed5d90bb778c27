"""Store-suite tests of what a store says about itself: ``capabilities``, ``tiers()``,
``write_view()``, ``local_path`` and the read-only view (``with_read_only()``).

Mixed into ``StoreSuite``; every backend passes them through the same ``store`` fixture.
"""

from __future__ import annotations

import os

import pytest

from trainstore.errors import InvalidKeyError, ReadOnlyError, TrainstoreError
from trainstore.store import Store, StoreCapabilities


def _bytes(buf: object) -> bytes:
    return bytes(memoryview(buf))  # type: ignore[arg-type]


class StoreViewSuite:
    """Capabilities, tiers and the read-only view. Subclasses provide ``store``."""

    def test_capabilities_describe_the_store(self, store: Store) -> None:
        caps = store.capabilities
        assert isinstance(caps, StoreCapabilities)
        assert not caps.read_only
        assert not caps.fsync or caps.local  # only a local store can fsync for us
        tiers = store.tiers()
        assert tiers and all(isinstance(t, Store) for t in tiers)
        assert caps.tiered == (len(tiers) > 1)
        if not caps.tiered:
            assert tiers == (store,)
            assert store.write_view() is store

    def test_local_path_holds_the_bytes(self, store: Store) -> None:
        store.put("lp/obj", b"local bytes")
        path = store.local_path("lp/obj")
        if store.capabilities.local:
            assert path is not None
        if path is not None:
            with open(path, "rb") as f:
                assert f.read() == b"local bytes"
        missing = store.local_path("lp/missing")
        assert missing is None or not os.path.exists(missing)

    def test_tiers_hold_what_was_written(self, store: Store) -> None:
        store.put("t/put", b"p")
        store.put_if_absent("t/commit", b"c")
        for key, data in (("t/put", b"p"), ("t/commit", b"c")):
            holders = [t for t in store.tiers() if t.exists(key)]
            assert holders, f"{key} is in no tier of {store.url}"
            assert all(_bytes(t.get(key)) == data for t in holders)
            assert _bytes(store.write_view().get(key)) == data

    def test_read_only_view_reads(self, store: Store) -> None:
        store.put("ro/a", b"0123456789")
        ro = store.with_read_only()
        assert ro.capabilities.read_only and not store.capabilities.read_only
        assert ro.capabilities.tiered == store.capabilities.tiered
        assert _bytes(ro.get("ro/a")) == b"0123456789"
        assert _bytes(ro.get_range("ro/a", 2, 3)) == b"234"
        assert [_bytes(b) for b in ro.get_ranges("ro/a", [(0, 1), (9, 1)])] == [b"0", b"9"]
        assert ro.head("ro/a").size == 10 and ro.exists("ro/a") and not ro.exists("ro/b")
        assert [m.key for m in ro.list("ro/")] == ["ro/a"]
        assert ro.with_read_only() is ro
        assert len(ro.tiers()) == len(store.tiers())
        assert all(t.capabilities.read_only for t in ro.tiers())

    def test_read_only_view_refuses_writes(self, store: Store) -> None:
        store.put("ro/a", b"kept")
        ro = store.with_read_only()
        for call in (lambda s: s.put("ro/a", b"changed"), lambda s: s.put("ro/new", b"x"),
                     lambda s: s.put_if_absent("ro/new", b"x"), lambda s: s.delete("ro/a")):
            for view in (ro, ro.write_view(), *ro.tiers()):
                with pytest.raises(ReadOnlyError) as info:
                    call(view)
                assert isinstance(info.value, PermissionError) and isinstance(info.value, TrainstoreError)
                assert "read-only" in str(info.value) and "ro/" in str(info.value)
        with pytest.raises(InvalidKeyError):
            ro.put("../escape", b"x")  # a bad key is still a bad key
        assert _bytes(store.get("ro/a")) == b"kept"
        assert not store.exists("ro/new")
        assert sorted(m.key for m in store.list("")) == ["ro/a"]

    def test_closing_the_read_only_view_keeps_the_store(self, store: Store) -> None:
        store.put("ro/a", b"1")
        with store.with_read_only() as ro:
            assert _bytes(ro.get("ro/a")) == b"1"
        store.put("ro/b", b"2")
        assert _bytes(store.get("ro/b")) == b"2"


__all__ = ["StoreViewSuite"]
