"""Lightning's multi-process strategies with trainstore: which are supported, and the sharded saves.

- ``strategy="ddp"`` (every DDP launcher: subprocess, spawn, torchrun): the model is
  replicated and Lightning calls ``CheckpointIO.save_checkpoint`` on rank 0 only, so rank 0
  writes it once, through the ``single`` save backend (``layout: full``). Every rank loads.
- ``ModelParallelStrategy`` (FSDP2 ``fully_shard``; Lightning writes its own DCP directory and
  never calls the CheckpointIO): ``TrainstoreModelParallelStrategy`` saves the sharded model
  and optimizer through the ``dcp`` backend - every rank writes its own shards, one manifest
  commits after all ranks wrote (``layout: sharded``) - and loads them resharded (another
  world size). The rest of Lightning's dict (loops, callbacks, schedulers) goes under one
  ``lightning`` key. Lightning's paths get pointers as in the single-process case.
- anything else (DeepSpeed, FSDP1's ``FSDPStrategy``, XLA): ``check_strategy`` raises
  ``ConfigError`` naming it and what to use instead.

The decisions every rank must share (which checkpoint a save goes to, which a load reads) are
taken on rank 0 and broadcast over a gloo group of the plugin's own, never the training's.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from ..dcp import StorageReader
from ..errors import ConfigError, TrainstoreError
from . import pyvalues
from .lightning_io import TrainstoreIOBase
from .lightning_layout import LAYOUT_SHARDED, check_global_step
from .lightning_pointers import as_loaded_through, norm_path
from .lightning_state import combine, content_hash
from .ranks import rank_and_world

log = logging.getLogger("trainstore.integrations.lightning")

REST = "lightning"  # key of Lightning's non-model, non-optimizer entries in a sharded checkpoint
SUPPORTED = ("ddp (all launchers: subprocess, spawn, torchrun; plugins=[TrainstoreCheckpointIO(...)])",
             "ModelParallelStrategy / FSDP2 (strategy=TrainstoreModelParallelStrategy(io=...))",
             "a single device")


def unsupported(what: str) -> ConfigError:
    return ConfigError(f"TrainstoreCheckpointIO does not support the Lightning strategy {what}: supported are "
                       + "; ".join(SUPPORTED) + ". For FSDP use ModelParallelStrategy (FSDP2 fully_shard in "
                       "configure_model); for DeepSpeed keep its own checkpointing")


class _Channel:
    """Rank 0 decides, every rank learns it: a gloo group created by all ranks at first use."""

    def __init__(self) -> None:
        self._group: Any = None

    def group(self) -> Any:
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def decide(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on rank 0, its value (or its error, raised on every rank) on all ranks."""
        rank, world = rank_and_world()
        if world == 1:
            return fn()
        box: list[Any] = [None]
        if rank == 0:
            try:
                box[0] = ("ok", fn())
            except TrainstoreError as exc:
                box[0] = ("error", exc)
        dist.broadcast_object_list(box, src=0, group=self.group())
        if box[0][0] == "error":
            if rank == 0:
                raise box[0][1]
            raise type(box[0][1])(f"rank 0: {box[0][1]}")
        return box[0][1]

    def gather(self, value: str) -> list[str]:
        _, world = rank_and_world()
        if world == 1:
            return [value]
        out: list[Any] = [None] * world
        dist.all_gather_object(out, value, group=self.group())
        return [str(v) for v in out]


class ShardedSaves:
    """Strategy mixin: sharded saves and loads through the trainstore plugin (see module docstring).
    ``io=``: the ``TrainstoreCheckpointIO`` (or pass it in ``plugins=[...]``)."""

    _trainstore_channel: _Channel | None = None

    def __init__(self, *args: Any, io: TrainstoreIOBase | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("save_distributed_checkpoint", True)
        if not kwargs["save_distributed_checkpoint"]:
            raise ConfigError(f"{type(self).__name__}(save_distributed_checkpoint=False) gathers the full state on "
                              "rank 0: use the framework's strategy with plugins=[TrainstoreCheckpointIO(...)] for that")
        super().__init__(*args, **kwargs)
        if io is not None:
            self.checkpoint_io = io

    def trainstore_io(self) -> TrainstoreIOBase:
        io = self.checkpoint_io  # type: ignore[attr-defined]
        if not isinstance(io, TrainstoreIOBase):
            raise ConfigError(f"{type(self).__name__} needs a TrainstoreCheckpointIO as its checkpoint_io "
                              f"(plugins=[TrainstoreCheckpointIO(...)] or checkpoint_io=...), got {type(io).__name__}")
        io.use_layout(LAYOUT_SHARDED)
        if self._trainstore_channel is None:
            self._trainstore_channel = _Channel()
        return io

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        io = self.trainstore_io()
        if storage_options is not None:
            raise ConfigError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        ch = self._trainstore_channel
        assert ch is not None
        name = norm_path(self.broadcast(filepath))  # type: ignore[attr-defined]
        step = check_global_step(checkpoint, name)
        state: dict[str, Any] = {"state_dict": checkpoint.pop("state_dict")}
        for i, opt in enumerate(checkpoint.pop("optimizer_states", [])):
            state[f"optimizer_{i}"] = opt
        state[REST] = pyvalues.encode(checkpoint, io.allow_pickle_paths)
        digest = combine(ch.gather(content_hash(state)))
        rank = rank_and_world()[0]

        def where() -> tuple:
            ref, save = io.place(step, digest)
            return ref, save, io.kind_for(ref)

        ref, save, kind = ch.decide(where)
        if save and not io.save_ref(ref, state, name, digest, LAYOUT_SHARDED, kind):
            return
        if rank == 0:
            io.name_path(name, ref)
        if io.torn_down:
            io.teardown()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        io = self.trainstore_io()
        ch = self._trainstore_channel
        assert ch is not None
        path = str(self.broadcast(checkpoint_path))  # type: ignore[attr-defined]
        io.wait()
        ref, last, why = ch.decide(lambda: io.resolve(path))
        model = self.model  # type: ignore[attr-defined]
        fitting = self.lightning_module.trainer.state.fn == "fit"  # type: ignore[attr-defined]
        optimizers = list(self.optimizers) if fitting else []  # type: ignore[attr-defined]
        opts = StateDictOptions(full_state_dict=False, cpu_offload=False)
        target: dict[str, Any] = {"state_dict": get_model_state_dict(model, options=opts)}
        for i, opt in enumerate(optimizers):
            target[f"optimizer_{i}"] = get_optimizer_state_dict(model, opt, options=opts)
        result = io.restore(ref, last, target, LAYOUT_SHARDED)
        strict = self.lightning_module.strict_loading  # type: ignore[attr-defined]
        set_model_state_dict(model, target["state_dict"], options=StateDictOptions(strict=strict))
        for i, opt in enumerate(optimizers):
            set_optimizer_state_dict(model, opt, target[f"optimizer_{i}"])
        job = ref[0] if ref is not None and result.step == ref[1] else io.job
        reader = StorageReader(io.manager_for(job).store, job, result.step)
        group = ch.group() if rank_and_world()[1] > 1 else None  # every rank reads the replicated rest
        rest = _load_state_dict_from_keys({REST}, storage_reader=reader, process_group=group)[REST]
        checkpoint = pyvalues.decode(rest, io.allow_pickle_paths)
        if optimizers:
            checkpoint["optimizer_states"] = [target[f"optimizer_{i}"] for i in range(len(optimizers))]
        if last and not path.startswith("trainstore:"):
            as_loaded_through(checkpoint, path)
        log.info("Lightning sharded load of %s (%s): %s", path, why, result)
        return checkpoint

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # loaded in load_checkpoint

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        pass  # loaded in load_checkpoint

    def remove_checkpoint(self, filepath: Any) -> None:
        if rank_and_world()[0] == 0:
            self.trainstore_io().remove_checkpoint(filepath)

    def teardown(self) -> None:
        """The framework's teardown, then the plugin's: pending saves commit (every rank takes
        part in a sharded one) before the process group goes (``ModelParallelStrategy``'s own
        teardown never calls the CheckpointIO's)."""
        super().teardown()  # type: ignore[misc]
        if isinstance(self.checkpoint_io, TrainstoreIOBase):  # type: ignore[attr-defined]
            self.checkpoint_io.teardown()  # type: ignore[attr-defined]


DDP_NAMES = {"ddp": "popen", "ddp_subprocess": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork",
             "ddp_notebook": "fork"}


@dataclass(frozen=True)
class LightningClasses:
    """The plugin and strategy classes of one Lightning namespace (``pytorch_lightning`` or
    ``lightning.pytorch``: two class hierarchies), and the strategy checks over them."""

    io: type
    model_parallel: type  # trainstore's (sharded saves)
    framework_model_parallel: type  # the framework's (its own DCP directory)
    ddp: type
    single: type

    def check(self, strategy: Any) -> Any:
        """``strategy`` if trainstore supports it, else ``ConfigError`` naming it and the way out."""
        if isinstance(strategy, (self.model_parallel, self.ddp, self.single)):
            return strategy
        name = type(strategy).__name__
        if isinstance(strategy, self.framework_model_parallel):
            name += " writing its own DCP directory (use TrainstoreModelParallelStrategy)"
        raise unsupported(name)

    def strategy(self, strategy: Any, io: TrainstoreIOBase, **kwargs: Any) -> Any:
        """The strategy to pass as ``Trainer(strategy=...)``, ``io`` attached: ``"ddp"`` (any DDP
        launcher: ``"ddp_spawn"``, ``"ddp_subprocess"``, torchrun), ``"model_parallel"`` /
        ``"fsdp2"`` (sharded), or a Strategy instance to check. Anything else (``"deepspeed"``,
        ``"fsdp"`` - FSDP1 -, XLA) raises ``ConfigError`` naming it and what to use instead."""
        if not isinstance(strategy, str):
            self.check(strategy)
            strategy.checkpoint_io = io
            return strategy
        name = strategy.lower()
        if name in DDP_NAMES:
            return self.ddp(start_method=DDP_NAMES[name], checkpoint_io=io, **kwargs)
        if name in ("model_parallel", "fsdp2"):
            return self.model_parallel(io=io, **kwargs)
        raise unsupported(repr(strategy))


FABRIC = {"pytorch_lightning": "lightning_fabric", "lightning.pytorch": "lightning.fabric"}


def namespace(module: str, package: str) -> tuple[type, type, Callable[..., Any], Callable[[Any], Any]]:
    """``(TrainstoreCheckpointIO, TrainstoreModelParallelStrategy, trainstore_strategy,
    check_strategy)`` of the Lightning ``package`` (``pytorch_lightning`` or ``lightning.pytorch``),
    the classes named as attributes of ``module`` (pickle finds them)."""
    checkpoint_io = importlib.import_module(f"{FABRIC[package]}.plugins.io.checkpoint_io").CheckpointIO
    strategies = importlib.import_module(f"{package}.strategies")
    io = type("TrainstoreCheckpointIO", (TrainstoreIOBase, checkpoint_io),
              {"__module__": module, "__doc__": "Lightning ``CheckpointIO`` saving to a trainstore job (lightning_io)."})
    mp = type("TrainstoreModelParallelStrategy", (ShardedSaves, strategies.ModelParallelStrategy),
              {"__module__": module, "__doc__": "``ModelParallelStrategy`` (FSDP2) whose sharded checkpoints go "
               "through trainstore's dcp backend (lightning_dist): ``TrainstoreModelParallelStrategy(io=...)``."})
    classes = LightningClasses(io, mp, strategies.ModelParallelStrategy, strategies.DDPStrategy,
                               strategies.SingleDeviceStrategy)
    return io, mp, classes.strategy, classes.check


__all__ = ["ShardedSaves", "LightningClasses", "namespace", "unsupported", "REST", "SUPPORTED"]
