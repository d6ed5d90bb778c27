"""Hugging Face formats both ways: export a registered model as a sharded ``from_pretrained``
folder; import a safetensors/HF folder as a checkpoint that fine-tunes incrementally."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import require  # tests/conftest.py: optional dependencies

require("transformers", install="pip install 'trainstore[hf]'")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.errors import (  # noqa: E402
    AlreadyExistsError,
    ChunkCorruptError,
    ConfigError,
    UnsupportedTypeError,
)
from trainstore.integrations.hf import TrainstoreTrainer  # noqa: E402
from trainstore.integrations.hf_export import export_pretrained, import_pretrained, read_pretrained  # noqa: E402
from trainstore.lifecycle.export import INDEX_NAME, parse_size, plan_shards  # noqa: E402
from trainstore.lifecycle.registry import Registry  # noqa: E402


def tiny(seed: int = 0, n_embd: int = 32) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=n_embd, n_layer=2, n_head=2))


def same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_registered_model_exports_as_sharded_folder_from_pretrained_loads(tmp_path: Path) -> None:
    model = tiny()
    with CheckpointManager(f"file://{tmp_path / 'store'}", "train") as mgr:
        mgr.save(7, {"model": model.state_dict(), "step": 7},
                 config={"hf_config": json.loads(model.config.to_json_string(use_diff=False))}, blocking=True)
        registry = Registry(mgr.store)
        registry.register("train", 7, "gpt")
        res = export_pretrained(registry, "gpt@1", tmp_path / "out", max_shard_size="40KB")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert INDEX_NAME in names and "config.json" in names and "SHA256SUMS" in names
    assert len(res.shards) > 2  # 40 KB shards of a ~170 KB model
    index = json.loads((tmp_path / "out" / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for shard in res.shards:  # none over the limit, except a single tensor larger than it
        size = sum(t.numel() * t.element_size() for t in read_pretrained_shard(tmp_path / "out" / shard).values())
        assert size <= 40_000 or len(read_pretrained_shard(tmp_path / "out" / shard)) == 1
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "out")
    same_params(loaded, model)


def read_pretrained_shard(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def test_export_refuses_existing_folder_and_missing_config(tmp_path: Path) -> None:
    with CheckpointManager(f"file://{tmp_path / 'store'}", "train") as mgr:
        mgr.save(1, {"model": {"w": torch.ones(3)}}, blocking=True)
        registry = Registry(mgr.store)
        registry.register("train", 1, "m")
        with pytest.raises(ConfigError, match="no Hugging Face config"):
            export_pretrained(registry, "m@1", tmp_path / "a")
        (tmp_path / "b").mkdir()
        (tmp_path / "b" / "keep.txt").write_text("x")
        with pytest.raises(AlreadyExistsError):
            export_pretrained(registry, "m@1", tmp_path / "b", config={"model_type": "gpt2"})
        assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["keep.txt"]
        assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    with pytest.raises(ConfigError):
        parse_size("5 parsecs")
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2MiB") == 2 << 20
    assert plan_shards({"a": 5, "b": 5, "c": 20, "d": 1}, 10) == [["a", "b"], ["c"], ["d"]]


def test_import_then_incremental_costs_only_the_changed_layer(tmp_path: Path) -> None:
    model = tiny(n_embd=64)
    model.save_pretrained(tmp_path / "base", max_shard_size="100KB")  # sharded HF folder, tied lm_head dropped
    assert (tmp_path / "base" / INDEX_NAME).exists()
    store = f"file://{tmp_path / 'store'}"
    with CheckpointManager(store, "ft", CheckpointPolicy(full_every=1000, incremental_every=1)) as mgr:
        info = import_pretrained(tmp_path / "base", mgr, step=0)
        assert info.kind == "full"
        state = mgr.restore()
        assert state["model"].keys() == {k for k in model.state_dict() if k != "lm_head.weight"}
        for k, t in state["model"].items():
            assert torch.equal(t, model.state_dict()[k]), k
        layer = "transformer.h.1.mlp.c_fc.weight"
        state["model"][layer] = state["model"][layer] + 0.5  # the fine-tune changed one layer
        inc = mgr.save(1, state, kind="incremental", blocking=True).wait()
    layer_bytes = model.state_dict()[layer].numel() * 4
    model_bytes = info.logical_bytes
    assert inc.kind == "incremental" and inc.base_step == 0
    assert inc.stored_bytes <= 1.1 * layer_bytes, (inc.stored_bytes, layer_bytes)
    assert inc.stored_bytes < model_bytes / 5
    assert info.config["hf_config"]["n_embd"] == 64


def test_trainer_fine_tune_starts_from_imported_weights(tmp_path: Path) -> None:
    base = tiny(seed=3)
    base.save_pretrained(tmp_path / "base")
    with CheckpointManager(f"file://{tmp_path / 'store'}", "ft") as mgr:
        import_pretrained(tmp_path / "base", mgr, step=0)
        fresh = tiny(seed=99)
        args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1, learning_rate=0.0,
                                 report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
        trainer = TrainstoreTrainer(model=fresh, args=args, train_dataset=[{"input_ids": torch.zeros(8, dtype=torch.long),
                                                                             "labels": torch.zeros(8, dtype=torch.long)}],
                                    checkpoints=mgr)
        trainer.train(resume_from_checkpoint=True)
        assert trainer.last_restore is not None and trainer.last_restore.step == 0
        assert trainer.state.global_step == 1  # a fresh run (step 0), not a resume: lr 0 keeps the weights
        same_params(fresh, base)


def test_import_refuses_pickle_and_corrupt_files(tmp_path: Path) -> None:
    (tmp_path / "pkl").mkdir()
    torch.save({"w": torch.ones(2)}, tmp_path / "pkl" / "pytorch_model.bin")
    with pytest.raises(UnsupportedTypeError, match="pickled"):
        read_pretrained(tmp_path / "pkl")
    (tmp_path / "st").mkdir()
    save_file({"w": torch.ones(4)}, tmp_path / "st" / "model.safetensors")
    (tmp_path / "st" / "SHA256SUMS").write_text(f"{'0' * 64}  model.safetensors\n")
    with pytest.raises(ChunkCorruptError, match="model.safetensors"):
        read_pretrained(tmp_path / "st")
