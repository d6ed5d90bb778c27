"""Lightning pointer files and the alias record: how Lightning's paths name trainstore checkpoints.

Lightning finds checkpoints by file name (``ckpt_path="last"`` lists ``last*.ckpt``;
``ModelCheckpoint`` checks whether a name exists before it picks ``-vN``), so every path
Lightning saves gets a small JSON *pointer* (store, job, step), written atomically when
``save_checkpoint`` returns: the path is visible at once, as Lightning's own file would be.
The alias record (``integrations/lightning/<job>/aliases.json`` in the store) maps each live
Lightning path to its (job, step), so a resumed run keeps managing the paths an earlier run
saved.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from safetensors.torch import load_file, save_file

from ..errors import ConfigError, NotFoundError
from ..fileio import fsync_dir, unlink_quietly
from ..store.base import Store

POINTER_FORMAT = "trainstore.lightning-pointer/1"
ALIASES_FORMAT = "trainstore.lightning-aliases/2"
OLD_ALIASES_FORMAT = "trainstore.lightning-aliases/1"  # path -> step (of the plugin's job)

Ref = tuple[str, int]  # (trainstore job, step)


def aliases_key(job: str) -> str:
    return f"integrations/lightning/{job}/aliases.json"


def norm_path(path: Any) -> str:
    text = os.fspath(path)
    return text if "://" in text else os.path.abspath(text)


def write_pointer(name: str, store_url: str, ref: Ref) -> None:
    """Write the pointer of ``name`` to ``ref``: appears whole or not at all."""
    body = json.dumps({"format": POINTER_FORMAT, "store": store_url, "job": ref[0], "step": ref[1]}).encode()
    fs, p = url_to_fs(name)
    if isinstance(fs, LocalFileSystem):
        d = os.path.dirname(p) or "."
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=d)  # exclusive
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            unlink_quietly(tmp)
            raise
        fsync_dir(d)
    else:
        with fs.open(p, "wb") as f:
            f.write(body)


def remove_pointer(name: str) -> None:
    fs, p = url_to_fs(name)
    if fs.exists(p):
        fs.rm(p)


def read_pointer(path: str) -> dict:
    """The pointer document at ``path``; clear errors for a missing file or another layout."""
    fs, p = url_to_fs(path)
    try:
        if fs.isdir(p):
            raise ConfigError(f"{path} is a directory (a checkpoint of Lightning's own sharded layout, FSDP / "
                              "ModelParallelStrategy): load it with the strategy's own checkpointing, not trainstore")
        with fs.open(p, "rb") as f:
            raw = f.read(1 << 16)
    except FileNotFoundError:
        raise NotFoundError(f"no Lightning checkpoint at {path}") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != POINTER_FORMAT or not isinstance(doc.get("step"), int) \
            or not isinstance(doc.get("job"), str):
        raise ConfigError(f"{path} is not a trainstore checkpoint pointer (a torch.save file of Lightning's own "
                          "TorchCheckpointIO? load it without TrainstoreCheckpointIO)")
    return doc


def resolve_path(text: str, job: str, owns_job: Callable[[str], bool]) -> tuple[Ref | None, bool, str]:
    """``(ref, last, why)`` of a load of ``text`` (a pointer file, ``trainstore:latest`` or
    ``trainstore:<step>``) by the plugin of ``job``: ``ref`` None means the newest that verifies;
    ``last``: fall back to the newest that verifies if ``ref`` cannot be restored."""
    if text.startswith("trainstore:"):
        what = text[len("trainstore:"):]
        if what == "latest":
            return None, True, "newest checkpoint that verifies"
        if what.isdigit():
            return (job, int(what)), False, f"step {what}"
        raise ConfigError(f"ckpt path {text!r}: use 'trainstore:latest' or 'trainstore:<step>'")
    pointer = read_pointer(text)
    if not owns_job(pointer["job"]):
        raise ConfigError(f"{text} is a checkpoint of job {pointer['job']!r}, this plugin saves job {job!r}")
    ref = (pointer["job"], int(pointer["step"]))
    last = os.path.basename(text).startswith("last")
    return ref, last, f"step {ref[1]} of {os.path.basename(text)}" + (" (else the newest that verifies)" if last else "")


def write_tensor_file(path: str, state: dict) -> None:
    """A dict of tensors that is no training checkpoint (no ``global_step``: the spawn launcher
    hands rank 0's weights to the main process this way) as a safetensors file at ``path``."""
    bad = [str(k) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise ConfigError(f"Lightning state for {path} has no global_step and is not a flat dict of tensors "
                          f"({', '.join(bad[:3])}): only training checkpoints are saved to the trainstore job")
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}, path)


def is_tensor_file(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < (1 << 30)


def read_tensor_file(path: str) -> dict:
    return dict(load_file(path))


class AliasRecord:
    """Lightning path -> (job, step), and the (job, step) refs the plugin created (only these
    are ever dropped when no path names them any more). Kept in the store."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.paths: dict[str, Ref] = {}
        self.created: set[Ref] = set()

    def load(self, store: Store) -> None:
        try:
            doc = json.loads(bytes(store.get(aliases_key(self.job))))
        except NotFoundError:
            return
        fmt = doc.get("format") if isinstance(doc, dict) else None
        if fmt == OLD_ALIASES_FORMAT:
            self.paths = {str(k): (self.job, int(v)) for k, v in doc["aliases"].items()}
            self.created = {(self.job, int(s)) for s in doc["created"]}
        elif fmt == ALIASES_FORMAT:
            self.paths = {str(k): (str(v[0]), int(v[1])) for k, v in doc["aliases"].items()}
            self.created = {(str(j), int(s)) for j, s in doc["created"]}
        else:
            raise ConfigError(f"{aliases_key(self.job)} in {store.url} is not a Lightning alias record")

    def save(self, store: Store) -> None:
        doc = {"format": ALIASES_FORMAT, "aliases": {k: list(v) for k, v in self.paths.items()},
               "created": sorted([j, s] for j, s in self.created)}
        store.put(aliases_key(self.job), json.dumps(doc, sort_keys=True).encode())

    def live(self) -> set[Ref]:
        return set(self.paths.values())


def as_loaded_through(checkpoint: dict, last_path: str) -> None:
    """Set ``last_model_path`` of the ModelCheckpoint states of ``last_path``'s directory to it.

    ``ModelCheckpoint`` sets that field just before saving ``last.ckpt``, so a real last file
    holds its own path there; a same-step save shares the checkpoint of the top-k file saved a
    moment earlier (or a fallback restores an older one), whose field is older. Without this,
    the resumed callback would not recognise ``last.ckpt`` and start ``last-v1.ckpt``.
    """
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, dict):
        return
    where = os.path.realpath(os.path.dirname(norm_path(last_path)))
    for state in callbacks.values():
        if isinstance(state, dict) and "last_model_path" in state and isinstance(state.get("dirpath"), str) \
                and os.path.realpath(state["dirpath"]) == where:
            state["last_model_path"] = os.path.join(state["dirpath"], os.path.basename(last_path))


__all__ = ["write_tensor_file", "is_tensor_file", "read_tensor_file", "POINTER_FORMAT", "ALIASES_FORMAT", "AliasRecord", "Ref", "aliases_key", "norm_path", "write_pointer", "resolve_path",
           "remove_pointer", "read_pointer", "as_loaded_through"]
