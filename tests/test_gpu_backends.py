"""backend=local_gpu and backend=serverless: their settings reach ART, and a machine that can't run them says so."""

from __future__ import annotations

import importlib.util
import typing

import pytest

from summrl.backends import BackendUnavailable, build_backend, internal_config
from summrl.errors import ConfigError
from summrl.preflight import PreflightError, check
from tests.conftest import ROOT, compose_config, run_cli


def test_local_gpu_settings_reach_arts_model_config_under_arts_own_names():
    from art import dev

    config = compose_config(["backend=local_gpu", "storage.enabled=false", "backend.gpu_memory_utilization=0.6",
                             "backend.max_model_len=8192", "+backend.engine_args.max_num_seqs=64", "model.lora.r=4"])
    internal = internal_config(config)
    assert internal["engine_args"] == {"gpu_memory_utilization": 0.6, "enforce_eager": False, "max_model_len": 8192,
                                       "max_num_seqs": 64}
    assert internal["peft_args"]["r"] == 4 and internal["init_args"]["load_in_4bit"] is True
    # Every key is one ART reads (its TypedDicts), so none is silently ignored.
    schemas = {"engine_args": dev.EngineArgs, "init_args": dev.InitArgs, "peft_args": dev.PeftArgs}
    assert set(internal) <= set(typing.get_type_hints(dev.InternalModelConfig))
    for section, schema in schemas.items():
        assert set(internal[section]) <= set(typing.get_type_hints(schema)), section


def test_engine_args_cannot_shadow_their_own_settings():
    with pytest.raises(ConfigError, match="backend.engine_args.gpu_memory_utilization: has its own setting"):
        compose_config(["backend=local_gpu", "+backend.engine_args.gpu_memory_utilization=0.5"])
    with pytest.raises(ConfigError, match=r"backend.gpu_memory_utilization: must be in \(0, 1\]"):
        compose_config(["backend=local_gpu", "backend.gpu_memory_utilization=1.5"])


@pytest.mark.skipif(importlib.util.find_spec("unsloth") is not None, reason="this machine has ART's GPU stack")
def test_local_gpu_without_the_gpu_extra_fails_before_anything_loads(tmp_path):
    config = compose_config(["backend=local_gpu", "storage.enabled=false", f"run.dir={tmp_path}"])
    with pytest.raises(BackendUnavailable, match=r"pip install -e '\.\[gpu\]'"):
        build_backend(config, str(tmp_path))
    assert not (tmp_path / "art").exists()


def test_serverless_needs_wandb_key_and_no_local_backup(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="storage.enabled=false"):
        compose_config(["backend=serverless"])
    config = compose_config(["backend=serverless", "storage.enabled=false"])
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(PreflightError, match="backend=serverless needs WANDB_API_KEY"):
        check(config)
    monkeypatch.setenv("WANDB_API_KEY", "planted-wandb")
    monkeypatch.setenv("GEMINI_API_KEY", "planted-gemini")  # the default judge's key
    check(config)
    from art.serverless import ServerlessBackend

    assert isinstance(build_backend(config, str(tmp_path)), ServerlessBackend)


@pytest.mark.skipif(importlib.util.find_spec("unsloth") is not None, reason="this machine has ART's GPU stack")
def test_cli_lists_what_a_local_gpu_run_lacks_in_a_second(tmp_path, monkeypatch):
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)
    result = run_cli(["backend=local_gpu", "judge=lexical", f"hydra.run.dir={tmp_path}"], cwd=ROOT, timeout=60,
                     env={"BACKUP_BUCKET": ""})
    assert result.returncode == 3  # a preflight error
    assert result.stderr.startswith("summrl: preflight error: this run can't start yet:")
    assert "pip install -e '.[gpu]'" in result.stderr and "BACKUP_BUCKET" in result.stderr
    assert not (tmp_path / "art").exists()
