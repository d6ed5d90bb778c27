"""A store on a local directory: the embedded default and the hot tier's backing.

Durability: every put writes a temp file in the target's directory, fsyncs it, renames (or
hard-links, for ``put_if_absent``) it into place and fsyncs the directory. A crash leaves
either no object or the whole one; stray temp files are never listed and are removed by
``sweep_temp``.

Large writes (1 MiB and up) go out with ``O_DIRECT`` (``direct_io``): no copy into the page
cache, whose first touch costs as much as the disk write in a fresh process. Raw checkpoint
pieces go straight from their 4 KiB-aligned staging slots; unaligned data (a codec's output)
through a small aligned bounce buffer (``fileio.write_direct``). A directory whose filesystem refuses ``O_DIRECT``
(``EINVAL``) is remembered and written buffered from then on; the commit (temp, fsync,
rename, fsync dir) is the same either way.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator, Sequence

from ..errors import (
    AlreadyExistsError,
    ConfigError,
    IntegrityError,
    InvalidKeyError,
    NotFoundError,
)
from ..fileio import (
    TEMP_PREFIX,
    create_temp,
    direct_writable,
    fsync_dir,
    io_error,
    unlink_quietly,
    write_all,
    write_direct,
)
from .base import Buffer, ObjectMeta, Store, StoreCapabilities, validate_key, validate_prefix


class LocalStore(Store):
    """Objects are files under ``root``; keys map to relative paths.

    ``create=False`` opens an existing directory only (``NotFoundError`` otherwise), for
    read-only callers such as ``trainstore store ls`` that must not leave directories behind.
    A local store cannot hold both ``a`` and ``a/b`` (a file cannot also be a directory);
    such a key raises ``InvalidKeyError``.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True, create: bool = True,
                 direct_io: bool = True) -> None:
        path = os.fspath(root)
        if (b"\x00" if isinstance(path, bytes) else "\x00") in path:  # no OS can name it (os.makedirs: ValueError)
            raise ConfigError(f"store path {path!r} contains a NUL byte")
        self.root = os.path.abspath(path)
        self.fsync = fsync
        self.direct_io = direct_io and hasattr(os, "O_DIRECT")
        self._direct_refused: set[str] = set()  # directories whose filesystem refused O_DIRECT
        self.url = "file://" + self.root
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ConfigError(f"store root {self.root} is a file, not a directory: a store (or a dataset to "
                              f"serve) is a folder; pass the folder that holds it, {os.path.dirname(self.root)}")
        if not create and not os.path.isdir(self.root):
            raise NotFoundError(f"no store directory at {self.root}")
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise io_error(exc, f"creating store directory {self.root}") from exc
        self._known_dirs: set[str] = {self.root}
        self._dirs_lock = threading.Lock()

    @property
    def capabilities(self) -> StoreCapabilities:
        return StoreCapabilities(local=True, fsync=self.fsync)

    # -- helpers ---------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        validate_key(key)
        for part in key.split("/"):
            if part.startswith(TEMP_PREFIX):
                raise InvalidKeyError(f"key segment {part!r} uses the reserved prefix {TEMP_PREFIX!r}")
        return os.path.join(self.root, *key.split("/"))

    def _ensure_dir(self, directory: str, key: str) -> None:
        """Create ``directory`` (and missing parents); fsync each new entry's parent, so a
        crash cannot lose the directory that holds a durable object."""
        with self._dirs_lock:
            if directory in self._known_dirs:
                return
        missing = []
        d = directory
        while d != self.root and not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    rel = os.path.relpath(d, self.root).replace(os.sep, "/")
                    raise InvalidKeyError(
                        f"key {key!r} needs directory {rel!r}, but an object {rel!r} exists in "
                        f"{self.url} (a local store cannot hold both 'x' and 'x/...')"
                    ) from None
                continue  # created concurrently
            except NotADirectoryError:
                raise InvalidKeyError(
                    f"key {key!r} lies under an existing object in {self.url} (a local store "
                    "cannot hold both 'x' and 'x/...')"
                ) from None
            if self.fsync:
                fsync_dir(os.path.dirname(d))
        with self._dirs_lock:
            self._known_dirs.add(directory)

    def _write_temp(self, path: str, data: Buffer, key: str) -> str:
        directory = os.path.dirname(path)
        self._ensure_dir(directory, key)
        direct = (self.fsync and self.direct_io and directory not in self._direct_refused
                  and direct_writable(data))
        try:
            fd, tmp = self._open_temp(directory, os.path.basename(path), direct)
        except FileNotFoundError:  # the directory was removed behind our back: recreate it
            with self._dirs_lock:
                self._known_dirs.discard(directory)
            self._ensure_dir(directory, key)
            fd, tmp = self._open_temp(directory, os.path.basename(path), direct)
        try:
            direct = direct and directory not in self._direct_refused
            if direct:
                self._write_direct(fd, data, directory)
            else:
                write_all(fd, data)
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp

    def _open_temp(self, directory: str, name: str, direct: bool) -> tuple[int, str]:
        """(fd, path) of a new exclusive temp file beside the object (``fileio.create_temp``)."""
        if direct:
            try:
                return create_temp(directory, name, flags=os.O_DIRECT, mode=0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._direct_refused.add(directory)  # this filesystem has no O_DIRECT: buffered from now on
        return create_temp(directory, name, mode=0o644)

    def _write_direct(self, fd: int, data: Buffer, directory: str) -> None:
        """``write_direct``; a filesystem that accepts the open but refuses the write
        (``EINVAL``) gets the whole file rewritten buffered, and is remembered."""
        try:
            write_direct(fd, data)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct_refused.add(directory)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            write_all(fd, data)

    def _meta(self, key: str, st: os.stat_result) -> ObjectMeta:
        return ObjectMeta(key, st.st_size, f"{st.st_mtime_ns:x}-{st.st_size:x}-{st.st_ino:x}", st.st_mtime)

    def _stat_meta(self, key: str, path: str, data: Buffer) -> ObjectMeta:
        """Meta of an object just written; a concurrent delete right after the rename (a gc
        sweep) is not a failure of the write."""
        try:
            return self._meta(key, os.stat(path))
        except FileNotFoundError:
            return ObjectMeta(key, memoryview(data).nbytes)

    # -- interface -------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFoundError(f"no object {key!r} in {self.url}") from None
        except OSError as exc:
            raise io_error(exc, f"reading {key!r} from {self.url}") from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.get_ranges(key, [(start, length)])[0]

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        path = self._path(key)
        for start, length in ranges:
            if start < 0 or length < 0:
                raise ConfigError(f"bad range start={start} length={length} for {key!r}")
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFoundError(f"no object {key!r} in {self.url}") from None
        except OSError as exc:
            raise io_error(exc, f"reading {key!r} from {self.url}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a directory of other keys, not an object
                raise NotFoundError(f"no object {key!r} in {self.url}")
            out = []
            for start, length in ranges:
                # Check against the size first: a hostile length must not allocate a buffer.
                data = os.pread(fd, length, start) if start + length <= st.st_size else b""
                if len(data) != length:
                    raise IntegrityError(
                        f"object {key!r} in {self.url} is shorter than the range "
                        f"[{start}, {start + length}) asked for"
                    )
                out.append(data)
            return out
        except OSError as exc:
            raise io_error(exc, f"reading {key!r} from {self.url}") from exc
        finally:
            os.close(fd)

    def _not_a_directory(self, key: str, path: str) -> None:
        if os.path.isdir(path):
            raise InvalidKeyError(
                f"key {key!r} names a directory of other keys in {self.url} (a local store "
                "cannot hold both 'x' and 'x/...')"
            )

    def put(self, key: str, data: Buffer) -> ObjectMeta:
        path = self._path(key)
        self._not_a_directory(key, path)
        try:
            tmp = self._write_temp(path, data, key)
            try:
                os.replace(tmp, path)
            except BaseException:
                unlink_quietly(tmp)
                raise
            if self.fsync:
                fsync_dir(os.path.dirname(path))
            return self._stat_meta(key, path, data)
        except OSError as exc:
            raise io_error(exc, f"writing {key!r} to {self.url}") from exc

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        path = self._path(key)
        self._not_a_directory(key, path)
        if os.path.exists(path):
            raise AlreadyExistsError(f"object {key!r} already exists in {self.url}")
        try:
            tmp = self._write_temp(path, data, key)
        except OSError as exc:
            raise io_error(exc, f"writing {key!r} to {self.url}") from exc
        try:
            os.link(tmp, path)  # atomic; fails if the name is taken
        except FileExistsError:
            self._not_a_directory(key, path)
            raise AlreadyExistsError(f"object {key!r} already exists in {self.url}") from None
        except OSError as exc:
            raise io_error(exc, f"committing {key!r} to {self.url}") from exc
        finally:
            unlink_quietly(tmp)
        try:
            if self.fsync:
                fsync_dir(os.path.dirname(path))
            return self._stat_meta(key, path, data)
        except OSError as exc:
            raise io_error(exc, f"committing {key!r} to {self.url}") from exc

    def head(self, key: str) -> ObjectMeta:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"no object {key!r} in {self.url}") from None
        except OSError as exc:
            raise io_error(exc, f"reading metadata of {key!r} in {self.url}") from exc
        if not os.path.isfile(path):
            raise NotFoundError(f"no object {key!r} in {self.url} (it is a directory)")
        return self._meta(key, st)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        validate_prefix(prefix)
        head, _, _ = prefix.rpartition("/")
        start = os.path.join(self.root, *head.split("/")) if head else self.root
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            for name in sorted(filenames):
                if name.startswith(TEMP_PREFIX):
                    continue
                key = rel_dir + name
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while listing
                yield self._meta(key, st)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return
        except OSError as exc:
            raise io_error(exc, f"deleting {key!r} from {self.url}") from exc

    def local_path(self, key: str) -> str:
        return self._path(key)

    def sweep_temp(self, older_than: float = 3600.0) -> int:
        """Remove temp files left by crashed writers; returns how many were removed."""
        removed = 0
        cutoff = time.time() - older_than
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for name in filenames:
                if name.startswith(TEMP_PREFIX):
                    full = os.path.join(dirpath, name)
                    try:
                        if os.stat(full).st_mtime < cutoff:
                            os.unlink(full)
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed


__all__ = ["LocalStore", "TEMP_PREFIX"]
