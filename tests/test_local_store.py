"""LocalStore specifics: nothing escapes the root, temp files, crash leftovers, read-only open."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from trainstore import open_store
from trainstore.errors import ConfigError, InvalidKeyError, NotFoundError
from trainstore.store import LocalStore
from trainstore.store.local import TEMP_PREFIX
from trainstore.testing.store_suite import BAD_KEYS


def _tree(path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), path))
    return out


def test_no_file_escapes_the_root(tmp_path):
    root = tmp_path / "sandbox" / "store"
    store = LocalStore(root)
    outside_before = _tree(tmp_path)
    escapes = BAD_KEYS + ["../escaped", "../../escaped", "a/../../escaped", "/tmp/escaped",
                          "..\\escaped", f"{TEMP_PREFIX}x", f"a/{TEMP_PREFIX}y"]
    for key in escapes:
        for call in (lambda: store.put(key, b"x"), lambda: store.put_if_absent(key, b"x"),
                     lambda: store.delete(key), lambda: store.get(key)):
            with pytest.raises(InvalidKeyError):
                call()
    assert _tree(tmp_path) == outside_before  # nothing created anywhere, inside or out
    assert not os.path.exists("/tmp/escaped")


def test_keys_map_under_root(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.put("a/b/c", b"1")
    assert store.local_path("a/b/c") == os.path.join(store.root, "a", "b", "c")
    assert (tmp_path / "s" / "a" / "b" / "c").read_bytes() == b"1"


def test_temp_files_are_never_listed_and_are_swept(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.put("dir/obj", b"data")
    leftover = tmp_path / "s" / "dir" / f"{TEMP_PREFIX}deadbeef.obj"
    leftover.write_bytes(b"half-written")
    root_leftover = tmp_path / "s" / f"{TEMP_PREFIX}cafe.x"
    root_leftover.write_bytes(b"partial")
    assert [m.key for m in store.list("")] == ["dir/obj"]
    assert [m.key for m in store.list("dir/")] == ["dir/obj"]
    # Recent temp files may belong to a live writer: not swept by default.
    assert store.sweep_temp() == 0
    old = time.time() - 7200
    os.utime(leftover, (old, old))
    os.utime(root_leftover, (old, old))
    assert store.sweep_temp() == 2
    assert not leftover.exists() and not root_leftover.exists()
    assert store.get("dir/obj") == b"data"


def test_crashed_writer_leaves_no_visible_object(tmp_path):
    """A writer SIGKILLed between the temp write and the rename leaves only a temp file."""
    root = tmp_path / "s"
    code = f"""
import os, signal
from trainstore.store import local
from trainstore.store.local import LocalStore
store = LocalStore({str(root)!r})
store.put("done", b"committed")
real_replace = os.replace
def crash(src, dst):
    os.kill(os.getpid(), signal.SIGKILL)
local.os.replace = crash
store.put("pending/obj", b"x" * 100000)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    store = LocalStore(root)
    assert [m.key for m in store.list("")] == ["done"]
    temps = [p for p in (root / "pending").iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert len(temps) == 1 and temps[0].stat().st_size == 100000  # fsynced before the rename
    assert store.sweep_temp(older_than=0) == 1
    assert list((root / "pending").iterdir()) == []
    assert store.get("done") == b"committed"


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A disk-full error half-way through a write: CapacityError, no object, no temp file."""
    import errno

    from trainstore.errors import CapacityError
    from trainstore.store import local

    store = LocalStore(tmp_path / "s")
    store.put("x/y", b"old")

    def half_then_full(fd, data):
        os.write(fd, bytes(memoryview(data)[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local, "write_all", half_then_full)
    for call in (lambda: store.put("x/y", b"n" * 100), lambda: store.put_if_absent("x/z", b"n" * 100)):
        with pytest.raises(CapacityError, match="no space"):
            call()
    assert [m.key for m in store.list("")] == ["x/y"]
    assert store.get("x/y") == b"old"
    assert sorted(p.name for p in (tmp_path / "s" / "x").iterdir()) == ["y"]


def test_file_and_directory_key_conflict_is_a_clear_error(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.put("a", b"1")
    with pytest.raises(InvalidKeyError, match="cannot hold both"):
        store.put("a/b", b"2")
    store.put("d/e", b"3")
    with pytest.raises(InvalidKeyError, match="cannot hold both"):
        store.put("d", b"4")
    with pytest.raises(InvalidKeyError, match="cannot hold both"):
        store.put_if_absent("d", b"4")
    with pytest.raises(NotFoundError):
        store.get("d")
    assert sorted(m.key for m in store.list("")) == ["a", "d/e"]


def test_long_key_segment(tmp_path):
    store = LocalStore(tmp_path / "s")
    name = "n" * 250  # near NAME_MAX: the temp name must not overflow it
    store.put(f"long/{name}", b"1")
    store.put_if_absent(f"long2/{name}", b"2")
    assert store.get(f"long/{name}") == b"1"


def test_directory_removed_behind_the_stores_back(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.put("gone/a", b"1")
    store.delete("gone/a")
    os.rmdir(tmp_path / "s" / "gone")
    store.put("gone/b", b"2")
    assert store.get("gone/b") == b"2"


def test_read_only_open_does_not_create(tmp_path):
    missing = tmp_path / "nope" / "store"
    with pytest.raises(NotFoundError, match="no store directory"):
        open_store(str(missing), create=False)
    assert not (tmp_path / "nope").exists()
    open_store(str(missing))  # default: created
    assert missing.is_dir()
    assert list(open_store(str(missing), create=False).list("")) == []


def test_root_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(ConfigError, match="not a directory"):
        LocalStore(f)


def test_file_url_and_fsync_option(tmp_path):
    store = open_store(f"file://{tmp_path}/s", fsync=False)
    assert isinstance(store, LocalStore) and not store.fsync
    store.put("k", b"v")
    assert store.get("k") == b"v"
    with pytest.raises(ConfigError, match="unknown options"):
        open_store(str(tmp_path / "t"), endpoint="http://x")


@pytest.mark.parametrize("path", ["\x00", "a\x00b", "file:///tmp/x\x00"])
def test_a_path_with_a_nul_byte_is_a_config_error(tmp_path, monkeypatch, path):
    """Found by tests/reliability/test_hostile_input.py's URL fuzzer: os.makedirs raised a bare
    ValueError ("embedded null byte") instead of an error of the hierarchy naming the path."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="NUL byte"):
        open_store(path)
    with pytest.raises(ConfigError, match="NUL byte"):
        LocalStore(path)
