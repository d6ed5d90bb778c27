"""Dataset versions: the manifest that makes a set of shards a published, immutable dataset.

Layout in a store::

    datasets/<name>/versions/<NNNNNN>.json   manifest, written last with put_if_absent
    datasets/<name>/shards/<file>            Parquet (raw, cleaned) or Arrow IPC (features)

A version exists only once its manifest is committed; shards not named by any manifest are
garbage. Every shard records its BLAKE3 checksum, verified on read by ``read_shard``. Every
stage commits a new version through ``derive`` (parents, operation, config and its hash, code
version; the next free number, retried when another writer took it). The layout a manifest
names must be registered in ``data.layouts``.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pyarrow as pa

from .. import naming
from ..chunks import content_hash
from ..errors import (
    AlreadyExistsError,
    ConfigError,
    IntegrityError,
    InvalidKeyError,
    ManifestError,
    NotFoundError,
)
from ..provenance import code_version, trainstore_version
from ..store.base import Buffer, Store, validate_key
from ..store.checked import read_checked
from .layouts import get_layout, layout_names
from .lineage import config_hash

FORMAT = "trainstore.dataset/1"
#: how often ``derive`` takes the next version number after another writer took one
COMMIT_ATTEMPTS = 10
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def check_name(name: str) -> str:
    return naming.check_name(name, "dataset name")


def versions_prefix(name: str) -> str:
    return f"datasets/{check_name(name)}/versions/"


def shards_prefix(name: str) -> str:
    return f"datasets/{check_name(name)}/shards/"


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def tensor_layout(t: pa.DataType) -> tuple[pa.DataType, list[int], bool]:
    """(element type, per-row shape, numeric) of a column type: a fixed_shape_tensor or
    nested fixed_size_list unwraps to its element type and shape; a scalar has shape ``[]``.
    ``numeric``: the element is an integer, float or boolean (maps to a numpy dtype)."""
    shape: list[int] = []
    if isinstance(t, pa.FixedShapeTensorType):
        shape, t = list(t.shape), t.value_type
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    return t, shape, pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def schema_from_b64(text: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except Exception as exc:
        raise ManifestError(f"dataset schema does not parse: {exc}") from None


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a version: where it is, how many rows, its size and checksum."""

    key: str
    rows: int
    bytes: int
    checksum: str


@dataclass(frozen=True)
class SourceFile:
    """An input file a version ingested: its path (relative to the ingest's common
    directory), BLAKE3 of its bytes, rows and size. Re-ingesting the same bytes is skipped."""

    path: str
    blake3: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class DatasetVersion:
    """A committed, immutable dataset version."""

    name: str
    version: int
    layout: str
    schema: pa.Schema
    shards: tuple[ShardInfo, ...]
    parents: tuple[str, ...] = ()  # "name@version" of each input
    operation: str = "ingest"
    config: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""
    code_version: str | None = None  # the user's code (provenance.code_version)
    trainstore_version: str | None = None  # the library that wrote it (provenance.trainstore_version)
    created: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    sources: tuple[SourceFile, ...] = ()  # files this version added (ingest)

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "name": self.name,
            "version": self.version,
            "layout": self.layout,
            "schema": schema_to_b64(self.schema),
            "shards": [asdict(s) for s in self.shards],
            "rows": self.rows,
            "bytes": self.bytes,
            "parents": list(self.parents),
            "operation": self.operation,
            "config": self.config,
            "config_hash": self.config_hash,
            "code_version": self.code_version,
            "trainstore_version": self.trainstore_version,
            "created": self.created,
            "extra": self.extra,
            "sources": [asdict(s) for s in self.sources],
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "") -> DatasetVersion:
        try:
            if obj.get("format") != FORMAT:
                raise ManifestError(f"dataset manifest {where}: unknown format {obj.get('format')!r}")
            shards = []
            for s in obj["shards"]:
                key = s["key"]
                try:
                    validate_key(key)
                except InvalidKeyError as exc:
                    raise ManifestError(f"dataset manifest {where}: bad shard key: {exc}") from None
                checksum = s["checksum"]
                if not (isinstance(checksum, str) and _HEX64.match(checksum)):
                    raise ManifestError(f"dataset manifest {where}: shard {key!r} has a malformed checksum")
                info = ShardInfo(key, _count(s["rows"], "rows", where), _count(s["bytes"], "bytes", where),
                                 checksum)
                shards.append(info)
            parents = obj.get("parents", [])
            if not (isinstance(parents, list) and all(isinstance(p, str) for p in parents)):
                raise ManifestError(f"dataset manifest {where}: parents must be a list of 'name@version'")
            layout = obj["layout"]
            if layout not in layout_names():
                raise ManifestError(f"dataset manifest {where}: unknown layout {layout!r}")
            return cls(
                name=check_name(obj["name"]),
                version=_count(obj["version"], "version", where),
                layout=layout,
                schema=schema_from_b64(obj["schema"]),
                shards=tuple(shards),
                parents=tuple(parents),
                operation=str(obj.get("operation", "")),
                config=dict(obj.get("config", {})),
                config_hash=str(obj.get("config_hash", "")),
                # a manifest older than trainstore_version: its code_version named trainstore's own
                code_version=obj.get("code_version") if "trainstore_version" in obj else None,
                trainstore_version=obj.get("trainstore_version", obj.get("code_version")),
                created=float(obj.get("created", 0.0)),
                extra=dict(obj.get("extra", {})),
                sources=tuple(_source(s, where) for s in obj.get("sources", [])),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ManifestError(f"dataset manifest {where} is malformed: {type(exc).__name__}: {exc}") from None


def _source(obj: Any, where: str) -> SourceFile:
    digest = obj["blake3"]
    if not (isinstance(digest, str) and _HEX64.match(digest)):
        raise ManifestError(f"dataset manifest {where}: source {obj.get('path')!r} has a malformed blake3")
    return SourceFile(str(obj["path"]), digest, _count(obj["rows"], "rows", where),
                      _count(obj["bytes"], "bytes", where))


def _count(value: Any, what: str, where: str) -> int:
    """A non-negative int from a manifest (no bools, floats or strings)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 62:
        raise ManifestError(f"dataset manifest {where}: {what} must be a non-negative integer, got {value!r:.40}")
    return value


def parse_ref(ref: str) -> tuple[str, int | None]:
    """'name' or 'name@N' -> (name, N or None for latest)."""
    name, sep, ver = ref.partition("@")
    if not sep:
        return check_name(name), None
    try:
        return check_name(name), int(ver)
    except ValueError:
        raise ConfigError(f"dataset reference {ref!r}: version must be an integer") from None


def list_versions(store: Store, name: str) -> list[int]:
    """Committed version numbers of ``name``, ascending."""
    out = []
    for meta in store.list(versions_prefix(name)):
        stem = meta.key.rsplit("/", 1)[-1]
        if stem.endswith(".json") and stem[:-5].isdigit():
            out.append(int(stem[:-5]))
    return sorted(out)


def list_datasets(store: Store) -> list[str]:
    names = set()
    for meta in store.list("datasets/"):
        parts = meta.key.split("/")
        if len(parts) >= 4 and parts[2] == "versions":
            names.add(parts[1])
    return sorted(names)


def load_version(store: Store, name: str, version: int | None = None) -> DatasetVersion:
    """The manifest of ``name@version`` (latest when ``version`` is None)."""
    if version is None:
        versions = list_versions(store, name)
        if not versions:
            raise NotFoundError(f"dataset {name!r} has no committed version in {store.url}")
        version = versions[-1]
    key = f"{versions_prefix(name)}{version:06d}.json"
    try:  # a bad copy in one tier is read from the next and repaired
        return read_checked(store, key, lambda raw: _parse_version(raw, key))
    except NotFoundError:
        raise NotFoundError(f"dataset version {name}@{version} not found in {store.url}") from None


def _parse_version(raw: Buffer, key: str) -> DatasetVersion:
    """A dataset manifest's bytes, checked (``ManifestError`` when corrupt or malformed)."""
    try:
        obj = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"dataset manifest {key} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ManifestError(f"dataset manifest {key}: not a JSON object")
    expected = obj.pop("checksum", None)
    if not isinstance(expected, str) or content_hash(_manifest_json(obj)) != expected:
        raise ManifestError(f"dataset manifest {key}: checksum {'mismatch' if expected else 'missing'} "
                            "(the manifest is corrupted)")
    return DatasetVersion.from_json(obj, where=key)


def _manifest_json(obj: dict) -> bytes:
    """The bytes a dataset manifest's checksum covers: sorted-key JSON without it."""
    return json.dumps(obj, sort_keys=True).encode()


def commit_version(store: Store, version: DatasetVersion) -> DatasetVersion:
    """Publish ``version`` atomically (put_if_absent); ``AlreadyExistsError`` if taken."""
    if version.created == 0.0:
        version = DatasetVersion(**{**version.__dict__, "created": time.time()})
    key = f"{versions_prefix(version.name)}{version.version:06d}.json"
    obj = version.to_json()
    obj["checksum"] = content_hash(_manifest_json(obj))  # a flipped bit anywhere is detected
    data = json.dumps(obj, sort_keys=True).encode()
    try:
        store.put_if_absent(key, data)
    except AlreadyExistsError:
        raise AlreadyExistsError(f"dataset version {version.id} already exists in {store.url}") from None
    return version


def next_version(store: Store, name: str) -> int:
    versions = list_versions(store, name)
    return versions[-1] + 1 if versions else 1


def derive(
    store: Store,
    parents: Sequence[DatasetVersion | str],
    operation: str,
    config: Mapping[str, Any],
    shards: Iterable[ShardInfo],
    *,
    name: str,
    layout: str,
    schema: pa.Schema,
    extra: Mapping[str, Any] | None = None,
    sources: Iterable[SourceFile] = (),
    version: int | None = None,
    digest: str | None = None,
) -> DatasetVersion:
    """Commit a new version of ``name`` made by ``operation`` from ``parents`` (versions or
    "name@version" ids) with ``config``: the one way every stage publishes a version.

    Records the config's hash (``digest`` when the caller computed it already) and the code
    version. ``version=None`` takes the next free number and, when another writer commits it
    first, the one after (``COMMIT_ATTEMPTS`` times); a given ``version`` is committed once
    (``AlreadyExistsError`` if taken: the caller re-plans, as ``commit`` of an ingest does).
    """
    config = dict(config)
    get_layout(layout)  # ConfigError for an unregistered layout, before anything is committed
    made = DatasetVersion(
        name=check_name(name), version=version or 0, layout=layout, schema=schema, shards=tuple(shards),
        parents=tuple(p.id if isinstance(p, DatasetVersion) else p for p in parents), operation=operation,
        config=config, config_hash=digest or config_hash(config), code_version=code_version(), trainstore_version=trainstore_version(),
        extra=dict(extra or {}), sources=tuple(sources),
    )
    if version is not None:
        return commit_version(store, made)
    for _attempt in range(COMMIT_ATTEMPTS):
        try:
            return commit_version(store, replace(made, version=next_version(store, name)))
        except AlreadyExistsError:
            continue
    raise AlreadyExistsError(f"could not commit a version of {name!r}: lost the race {COMMIT_ATTEMPTS} times")


def verify_shard_bytes(info: ShardInfo, data: Buffer) -> None:
    """Raise ``IntegrityError`` naming the shard if ``data`` is not what the manifest says."""
    n = memoryview(data).nbytes
    if n != info.bytes:
        raise IntegrityError(f"shard {info.key}: {n} bytes, manifest says {info.bytes}")
    if content_hash(data) != info.checksum:
        raise IntegrityError(f"shard {info.key}: checksum mismatch (corrupted)")


def read_shard(store: Store, info: ShardInfo) -> Buffer:
    """Whole shard bytes, verified against the manifest."""
    data = store.get(info.key)
    verify_shard_bytes(info, data)
    return data


def iter_lineage(store: Store, ref: str) -> Iterator[DatasetVersion]:
    """The version and all its ancestors, depth first."""
    seen: set[str] = set()
    stack = [ref]
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        name, ver = parse_ref(cur)
        v = load_version(store, name, ver)
        yield v
        stack.extend(reversed(v.parents))
