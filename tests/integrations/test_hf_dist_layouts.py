"""Bad input of the multi-process Hugging Face integrations: an engine trainstore does not cover
(DeepSpeed, FSDP1) and a checkpoint saved by another framework or state layout are refused
with a ``ConfigError`` that says which, before any state is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import require  # tests/conftest.py: optional dependencies

require("transformers", install="pip install 'trainstore[hf]'")
require("accelerate", install="pip install 'trainstore[hf]'")

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin  # noqa: E402
from harness.dist import run_ranks  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from integrations.hf_child import Tokens, tiny_model  # noqa: E402
from trainstore.checkpoint import CheckpointManager  # noqa: E402
from trainstore.errors import ConfigError  # noqa: E402
from trainstore.integrations.hf import TrainstoreTrainer  # noqa: E402
from trainstore.integrations.hf_accelerate import AcceleratorCheckpoints  # noqa: E402
from trainstore.integrations.hf_dist import check_engine  # noqa: E402

HERE = str(Path(__file__).parent)


def tiny():
    return tiny_model(), Tokens()


def one_step_trainer(tmp: Path, mgr: CheckpointManager) -> TrainstoreTrainer:
    model, data = tiny()
    args = TrainingArguments(output_dir=str(tmp / "out"), max_steps=1, per_device_train_batch_size=4, save_steps=1,
                             save_strategy="steps", report_to=[], use_cpu=True, disable_tqdm=True)
    return TrainstoreTrainer(model=model, args=args, train_dataset=data, checkpoints=mgr)


def test_engines_not_covered_name_what_to_use():
    with pytest.raises(ConfigError, match="DeepSpeed.*FSDP2.*DDP"):
        check_engine(True, None)
    with pytest.raises(ConfigError, match="FSDP1.*fsdp_version=2"):
        check_engine(False, FullyShardedDataParallelPlugin(fsdp_version=1))
    check_engine(False, FullyShardedDataParallelPlugin(fsdp_version=2))
    check_engine(False, None)


def test_trainer_refuses_an_accelerate_checkpoint_and_accelerate_a_trainer_one(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    model, _ = tiny()
    with CheckpointManager(store, "acc") as mgr:
        AcceleratorCheckpoints(Accelerator(cpu=True), mgr, models=[model]).save(3)
        mgr.wait()
        trainer = one_step_trainer(tmp_path, mgr)
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        with pytest.raises(ConfigError, match=r"step 3 .* saved by AcceleratorCheckpoints, single process"):
            trainer.train(resume_from_checkpoint=True)
        assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    with CheckpointManager(store, "tr") as mgr:
        one_step_trainer(tmp_path, mgr).train()
        with pytest.raises(ConfigError, match=r"step 1 .* saved by TrainstoreTrainer, single process.*"
                                              r"AcceleratorCheckpoints resumes only from"):
            AcceleratorCheckpoints(Accelerator(cpu=True), mgr, models=[model]).load()


def test_fsdp_run_refuses_a_single_process_checkpoint(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    with CheckpointManager(store, "single") as mgr:
        one_step_trainer(tmp_path, mgr).train()
    res = run_ranks("hf_dist_worker:trainer", world=2, timeout_s=240, pg_timeout_s=60, pythonpath=[HERE],
                    args={"store": store, "job": "single", "root": str(tmp_path / "r"), "out": str(tmp_path / "r"),
                          "mode": "fsdp", "resume": True})
    for r in res:
        assert r.error_type == "ConfigError", (r.error, r.stderr[-2000:])
        assert "was saved by a single-process run" in r.error and "resumes only from a multi-process" in r.error
