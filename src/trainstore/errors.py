"""The error hierarchy: every failure trainstore reports is a ``TrainstoreError``.

Each class also inherits the matching built-in exception, so callers that already catch
``FileNotFoundError`` or ``ValueError`` keep working, while callers that want to handle
"anything trainstore said no to" catch ``TrainstoreError``. Messages name what was wrong
and where (the key, the URL, the path in a state dict).
"""

from __future__ import annotations


class TrainstoreError(Exception):
    """Root of every error trainstore raises on purpose."""


class ConfigError(TrainstoreError, ValueError):
    """A bad argument, URL, option or configuration value."""


class InvalidKeyError(TrainstoreError, ValueError):
    """A store key that is malformed or would escape the store's prefix."""


class NotFoundError(TrainstoreError, FileNotFoundError):
    """An object, checkpoint, dataset version, model or alias that does not exist."""


class AlreadyExistsError(TrainstoreError, FileExistsError):
    """A conditional create lost: the key (or step, or version) already exists."""


class ConflictError(TrainstoreError, RuntimeError):
    """A conditional update lost a race (etag mismatch); retry with fresh state."""


class IntegrityError(TrainstoreError, ValueError):
    """Stored bytes do not match what their reference or manifest promises."""


class ChunkCorruptError(IntegrityError):
    """A chunk's content does not hash to its name, or fails to decode."""


class ManifestError(IntegrityError):
    """A manifest is unreadable, malformed or refers to something impossible."""


class ChunkMissingError(IntegrityError, NotFoundError):
    """A chunk that a committed manifest names does not exist in the store."""


class StoreError(TrainstoreError, OSError):
    """An I/O operation on a store failed for a reason not covered below."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached, or kept failing past the retry budget."""


class CredentialsError(TrainstoreError, PermissionError):
    """Credentials are missing or were refused."""


class ReadOnlyError(TrainstoreError, PermissionError):
    """A write (put, put_if_absent, delete) through a read-only view of a store
    (``Store.with_read_only()``)."""


class CapacityError(StoreError):
    """Out of space: a full disk, or a cache limit smaller than one object."""


class UnsupportedTypeError(TrainstoreError, TypeError):
    """A value that cannot be stored safely (it would need pickle to restore)."""


class SchemaError(TrainstoreError, ValueError):
    """Records that do not match a dataset's schema."""


class NoValidCheckpointError(NotFoundError):
    """Checkpoints exist but none could be restored; the message lists each and why it failed."""


class NoCheckpointError(NoValidCheckpointError):
    """The job has no committed checkpoint at all (a fresh start).

    A subclass of ``NoValidCheckpointError`` so that existing ``except NoValidCheckpointError``
    callers keep catching it; catch ``NoCheckpointError`` to start fresh only when nothing was
    ever saved, and let ``NoValidCheckpointError`` (every checkpoint corrupt) propagate.
    """


class RestoreIncompleteError(TrainstoreError, RuntimeError):
    """``restore_into`` failed after it began writing the target (a piece that verified in its
    first pass failed when read again); the target holds part of the checkpoint."""


class BackgroundError(TrainstoreError, RuntimeError):
    """A background operation (async save, upload) failed; raised at the next call."""


class DistributedError(TrainstoreError, RuntimeError):
    """A rank of a distributed operation failed; names the rank."""


class TransformError(TrainstoreError, RuntimeError):
    """A user transform function failed; names the function, the shard and the row range."""
