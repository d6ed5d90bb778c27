"""Which input files an ingest reads, and which file contents a dataset already holds.

``expand_paths`` turns paths, directories and globs into a sorted list of files;
``SourcesIndex`` reads, once per committed version, the BLAKE3 digests of the files each
version ingested (``DatasetVersion.sources``), so a file already ingested is recognised.
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Iterable

from ...errors import NotFoundError
from ...store.base import Store
from ..versions import list_versions, load_version


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Paths and globs -> sorted existing files; ``NotFoundError`` naming what matched nothing."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[str] = []
    for item in items:
        text = os.fspath(item)
        if any(c in text for c in "*?["):
            matches = sorted(p for p in globlib.glob(text, recursive=True) if os.path.isfile(p))
            if not matches:
                raise NotFoundError(f"no file matches {text!r}")
            out.extend(matches)
        elif os.path.isfile(text):
            out.append(text)
        elif os.path.isdir(text):
            found = sorted(
                os.path.join(d, f) for d, _, fs in os.walk(text) for f in fs if not f.startswith(".")
            )
            out.extend(found)
        else:
            raise NotFoundError(f"input file {text!r} does not exist")
    return out


class SourcesIndex:
    """Which file digests the committed versions of one dataset ingested, and where.

    Versions are immutable, so each is read once; ``refresh`` reads only the new ones."""

    def __init__(self, store: Store, dataset: str) -> None:
        self.store = store
        self.dataset = dataset
        self._seen: set[int] = set()
        self._where: dict[str, str] = {}

    def refresh(self) -> dict[str, str]:
        """``{blake3: "name@version"}`` of every file ingested by a committed version."""
        for ver in list_versions(self.store, self.dataset):
            if ver not in self._seen:
                version = load_version(self.store, self.dataset, ver)
                for src in version.sources:
                    self._where.setdefault(src.blake3, version.id)
                self._seen.add(ver)
        return dict(self._where)


__all__ = ["SourcesIndex", "expand_paths"]
