"""Which content of an object the store holds: the tag that tells a rewritten object apart.

trainstore's own objects never change under a key (chunks are content-addressed, shards are
versioned, both checked by BLAKE3). Files it did not write (an external Parquet directory, a
Hugging Face ``datasets`` folder) can be rewritten in place by their owner, at the same size.
Their cached copies are told apart by ``source_tag``: what the store reports for one content
of the object - the ETag (S3, GCS, Azure; a new one for every new content) or, for a local
store, its mtime/size/inode tag (``LocalStore`` reports that as the ETag) - and ``check_unchanged``
raises ``IntegrityError`` naming the object when the store now holds another content.
In the node cache a tagged copy is named ``<hash of tag>.<name>`` (``tagged_name``), so a new
content is a miss; ``other_contents`` finds the copies of the other tags beside one.
"""

from __future__ import annotations

import hashlib
import os
import re

from ..errors import IntegrityError
from ..store import ObjectMeta, Store

_TAG_CHARS = 16
#: the name of a tagged copy: the tag's hash, a dot, the key's last segment
_TAGGED = re.compile(rf"[0-9a-f]{{{_TAG_CHARS}}}\.")


def source_tag(meta: ObjectMeta) -> str | None:
    """The tag of the content ``meta`` describes (None: the store reports nothing that would
    tell a rewrite apart; then only the size is checked)."""
    if meta.etag:
        return f"etag:{meta.etag}"
    if meta.mtime is not None:
        return f"mtime:{meta.mtime!r}"
    return None


def check_unchanged(store: Store, key: str, tag: str, size: int | None) -> None:
    """``IntegrityError`` naming ``key`` unless the store still holds the content ``tag``
    (and ``size`` bytes) names."""
    meta = store.head(key)
    now = source_tag(meta)
    if now != tag or (size is not None and meta.size != size):
        raise IntegrityError(
            f"{store.url}/{key} changed since it was listed ({tag}, {size} bytes; now {now}, {meta.size} "
            "bytes): it was rewritten in place; open the data again (Dataset.open) to serve its new content"
        )


def tagged_name(tag: str, name: str) -> str:
    """The file name of the copy of content ``tag`` of an object whose key ends in ``name``."""
    return f"{hashlib.sha256(tag.encode()).hexdigest()[:_TAG_CHARS]}.{name}"


def other_contents(path: str) -> list[str]:
    """The copies beside the tagged copy ``path`` of the same object, of other contents."""
    directory, name = os.path.split(path)
    rest = name[_TAG_CHARS + 1:]
    try:
        return [e.path for e in os.scandir(directory)
                if e.name != name and e.name[_TAG_CHARS + 1:] == rest and _TAGGED.match(e.name)]
    except FileNotFoundError:
        return []


__all__ = ["check_unchanged", "other_contents", "source_tag", "tagged_name"]
