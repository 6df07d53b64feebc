"""backend=local_gpu and backend=serverless: their settings reach ART, and a machine that can't run them says so."""

from __future__ import annotations

import importlib.util
import json
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


def test_a_lora_rank_above_vllms_default_reaches_its_engine():
    """vLLM loads adapters up to engine_args.max_lora_rank (16 by default) and ART does not pass the LoRA's rank on."""
    wide = internal_config(compose_config(["backend=local_gpu", "storage.enabled=false", "model.lora.r=32"]))
    assert wide["engine_args"]["max_lora_rank"] == 32 and wide["peft_args"]["r"] == 32
    assert "max_lora_rank" not in internal_config(compose_config(["backend=local_gpu", "storage.enabled=false",
                                                                  "model.lora.r=16"]))["engine_args"]


def test_a_lora_rank_vllm_does_not_take_becomes_the_next_one_it_does():
    """vLLM's LoRAConfig takes max_lora_rank in (1, 8, 16, 32, 64, 128, 256, 320, 512) only: 24 exited its runtime at
    startup with nothing but its exit code. The next allowed value serves the adapter; above 512 none can."""
    def engine(r):
        return internal_config(compose_config(["backend=local_gpu", "storage.enabled=false",
                                               f"model.lora.r={r}"]))["engine_args"]["max_lora_rank"]

    assert (engine(24), engine(64), engine(300), engine(512)) == (32, 64, 320, 512)
    refused = r"model.lora.r: is 600, but vLLM \(backend=local_gpu, or skypilot's GPU\) serves LoRA ranks up to 512"
    for backend in (["backend=local_gpu"], ["backend=skypilot"]):  # as the config composes, before a GPU is rented
        with pytest.raises(ConfigError, match=refused):
            compose_config([*backend, "storage.enabled=false", "model.lora.r=600"])
    compose_config(["experiment=local", "model.lora.r=600"])  # the embedded engine takes any rank


@pytest.fixture
def gpu_stack(monkeypatch):
    """A machine with ART's GPU stack (Unsloth, a vLLM runtime) whose torch sees ``gpus(n)`` CUDA GPUs."""
    import torch

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "unsloth" else
                        find_spec(name, *a))
    monkeypatch.setenv("ART_VLLM_RUNTIME_BIN", "/opt/vllm/bin/art-vllm-runtime-server")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return lambda n: monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_arts_dedicated_mode_on_one_gpu_is_refused_before_anything_loads(gpu_stack, tmp_path):
    """model.gpus=2 trains on GPU 0 and serves on GPU 1 (trainer_gpu_ids, inference_gpu_ids): on one GPU vLLM died,
    vaguely, after Unsloth had loaded the model."""
    from summrl.backends import check_local_gpu

    two = compose_config(["model=qwen2_5_14b", "backend=local_gpu", "storage.enabled=false", f"run.dir={tmp_path}"])
    gpu_stack(1)
    refused = (r"model.gpus=2: model=qwen2_5_14b trains on 2 GPUs \(ART's dedicated mode\) and torch sees 1: use "
               r"backend=skypilot backend.accelerators=H100:2, or a model that trains on one GPU")
    with pytest.raises(BackendUnavailable, match=refused):
        check_local_gpu(two)
    with pytest.raises(BackendUnavailable, match=refused):
        build_backend(two, str(tmp_path))
    assert not (tmp_path / "art").exists()
    gpu_stack(2)
    check_local_gpu(two)
    gpu_stack(1)
    check_local_gpu(compose_config(["backend=local_gpu", "storage.enabled=false"]))  # model.gpus=1


@pytest.mark.parametrize("backend", [["backend=local_gpu"], ["backend.accelerators=H100:2"]])
def test_sft_in_arts_dedicated_mode_is_refused_before_the_teacher_is_paid(backend):
    """ART 0.5.18's train_sft raises NotImplementedError in dedicated mode (model.gpus=2): the run would collect, and
    pay for, every teacher summary and then fail at training, on every rerun."""
    two_gpus = ["model=qwen2_5_14b", "storage.enabled=false", *backend]
    assert compose_config(two_gpus).model.gpus == 2
    with pytest.raises(ConfigError, match=r"sft: sft=best_of_n with model=qwen2_5_14b \(model.gpus=2, ART's dedicated "
                                          r"mode\): ART 0.5.18 can't train SFT in dedicated mode"):
        compose_config([*two_gpus, "sft=best_of_n"])


def test_serving_checkpoints_on_a_gpu_starts_one_vllm(monkeypatch):
    """TrainableModel.register starts ART's vLLM server (LocalBackend._prepare_backend_for_training): a second call
    started another, which on one GPU asks for memory the first holds. ART's own classes, a stand-in backend."""
    import asyncio
    from pathlib import Path

    import art.local

    from summrl.backends.serving import LocalGPUServer
    from summrl.checkpoints import TrainedRun

    started = []

    class Backend:  # LocalBackend's surface that register and LocalGPUServer use
        def __init__(self, path):
            self.path = path

        async def register(self, model):
            model.base_path = self.path

        async def _prepare_backend_for_training(self, model, config):
            started.append(model.name)
            return f"http://127.0.0.1:{8000 + len(started)}/v1", "key"

        async def _get_service(self, model):
            return object()

    monkeypatch.setattr(art.local, "LocalBackend", Backend)
    config = compose_config(["backend=local_gpu", "storage.enabled=false"])
    run = TrainedRun(run_dir=Path("/runs/r"), name="r", checkpoints_dir=Path("/runs/r/art/summrl/models/r/checkpoints"),
                     steps=[1])
    server = asyncio.run(LocalGPUServer(config, run).start())
    assert started == ["r"] and (server.base_url, server.api_key) == ("http://127.0.0.1:8001/v1", "key")


def test_the_base_model_is_served_on_a_gpu_as_an_adapter_that_adds_nothing(shared_run, monkeypatch):
    """ART's vLLM answers to <run>@<step> only: the base model's Hugging Face name was a 404, so step 0 of every
    benchmark failed on a GPU. Step 0 is the run's adapter with every lora_B zero, loaded as <run>@0."""
    import asyncio
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    from summrl.backends.serving import LocalGPUServer
    from summrl.checkpoints import trained_run

    loaded = {}

    class Service:  # ART's UnslothService: register_lora_for_step loads the folder's adapter as <run>@<step>
        async def register_lora_for_step(self, step, path):
            loaded[step] = Path(path)

    run = trained_run(shared_run.run_dir)
    server = LocalGPUServer(compose_config(["backend=local_gpu", "storage.enabled=false"]), run)
    server._service = Service()
    names = asyncio.run(server.serve(0)), asyncio.run(server.serve(3)), asyncio.run(server.serve(0))
    assert names == (f"{run.name}@0", f"{run.name}@3", f"{run.name}@0") and loaded[3] == run.checkpoint(3)
    assert run.steps[-1] == 3  # the latest checkpoint's adapter: its shapes are the run's
    zero, trained = load_file(loaded[0] / "adapter_model.safetensors"), load_file(run.checkpoint(3) /
                                                                                   "adapter_model.safetensors")
    assert zero.keys() == trained.keys() and any("lora_B" in k for k in zero)
    for key, tensor in zero.items():  # B = 0: the delta B·A adds nothing; A is kept, so the shapes are the run's
        assert torch.equal(tensor, torch.zeros_like(trained[key]) if "lora_B" in key else trained[key]), key
    assert (loaded[0] / "adapter_config.json").read_bytes() == (run.checkpoint(3) / "adapter_config.json").read_bytes()
    server.backend = type("Backend", (), {"close": lambda self: asyncio.sleep(0)})()
    asyncio.run(server.close())
    assert not loaded[0].exists()  # made for this server, removed with it


def test_a_serverless_runs_history_is_written_in_its_run_folder(tmp_path):
    """ART's model writes history.jsonl and trajectories under its base_path, ".art" in the working folder unless the
    backend sets it; LocalBackend does, ServerlessBackend does not. The W&B mirror and summrl.report read the run's."""
    from pathlib import Path

    from summrl.loop import trainable_model
    from summrl.storage import model_dir

    config = compose_config(["backend=serverless", "judge=lexical", "storage.enabled=false", f"run.dir={tmp_path}",
                             "run.name=r"])
    model = trainable_model(config)
    assert Path(model.base_path) == tmp_path / "art"
    assert Path(model._get_output_dir()) == model_dir(config) == tmp_path / "art" / config.project / "models" / "r"


def test_art_opens_no_wandb_run_beside_summrls_tracker(tmp_path, monkeypatch):
    """ART 0.5.18's LocalBackend.register (and its train, and ServerlessBackend.train) opened a W&B run whenever
    WANDB_API_KEY was set, whatever report_metrics said, with the run's name as its id: a second writer to the
    tracker's run. ART's own LocalBackend.register, which runs on this CPU."""
    import asyncio

    import wandb
    from art.local import LocalBackend

    from summrl.backends import art_dir
    from summrl.loop import trainable_model

    monkeypatch.setenv("WANDB_API_KEY", "not-a-key")
    opened = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: opened.append(kwargs))
    config = compose_config(["backend=local_gpu", "storage.enabled=false", f"run.dir={tmp_path}", "run.name=r"])
    model = trainable_model(config)
    asyncio.run(LocalBackend(path=art_dir(str(tmp_path))).register(model))
    assert opened == [] and model._get_wandb_run() is None


def test_a_token_read_from_the_environment_is_not_saved_in_arts_model_json(tmp_path, monkeypatch):
    """LocalBackend.register writes the model with its _internal_config resolved to model.json in the run folder: a
    token given as +model.init_args.token=${oc.env:HF_TOKEN}, which the config's own refusal suggests, was there in
    clear (found by an audit). ART's own register on this CPU; only vLLM's start is left out."""
    import asyncio

    from art.local import LocalBackend

    from summrl.backends import art_dir
    from summrl.loop import trainable_model

    monkeypatch.setenv("HF_TOKEN", "hf_PLANTEDtoken0123456789abcdef")

    async def no_vllm(self, model, config=None):
        return "http://127.0.0.1:1/v1", "local"

    monkeypatch.setattr(LocalBackend, "_prepare_backend_for_training", no_vllm)
    config = compose_config(["backend=local_gpu", "storage.enabled=false", f"run.dir={tmp_path}", "run.name=r",
                             "+model.init_args.token=${oc.env:HF_TOKEN}"])
    model = trainable_model(config)
    assert model._internal_config["init_args"]["token"] == "hf_PLANTEDtoken0123456789abcdef"  # what Unsloth gets
    asyncio.run(model.register(LocalBackend(path=art_dir(str(tmp_path)))))
    (saved,) = tmp_path.rglob("model.json")
    assert "hf_PLANTED" not in saved.read_text()
    assert json.loads(saved.read_text())["_internal_config"]["init_args"]["load_in_4bit"] is True  # the rest kept


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
    # Qwen3's enable_thinking=false would reach neither the rollouts nor W&B's trainer: it would think
    with pytest.raises(ConfigError, match=r"^model.chat_template_kwargs=\{'enable_thinking': False\}: backend=serverless "
                                          r"can't apply them .*: use backend=local_gpu or backend=skypilot"):
        compose_config(["backend=serverless", "model=qwen3_8b", "storage.enabled=false"])
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


def test_step_0_is_served_from_any_checkpoint_on_disk_not_only_those_benchmarked(tmp_path):
    """benchmark.steps=[0] of a run whose only checkpoint is 4 (no step 0: restored from S3) raised FileNotFoundError:
    the zero adapter was made only from the steps chosen (found by this stop's benchmark audit)."""
    import types

    import torch
    from safetensors.torch import load_file, save_file

    from summrl.backends.serving import LocalGPUServer
    from summrl.checkpoints import TrainedRun

    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "0004").mkdir(parents=True)
    save_file({"x.lora_A.weight": torch.ones(2, 2), "x.lora_B.weight": torch.ones(2, 2)},
              str(checkpoints / "0004" / "adapter_model.safetensors"))
    (checkpoints / "0004" / "adapter_config.json").write_text("{}")
    run = TrainedRun(run_dir=tmp_path, name="r", checkpoints_dir=checkpoints, steps=[0])
    config = types.SimpleNamespace(model=types.SimpleNamespace(chat_template_kwargs={}),
                                   backend=types.SimpleNamespace(max_model_len=None))
    zero = load_file(str(LocalGPUServer(config, run)._zero_adapter() / "adapter_model.safetensors"))
    assert zero["x.lora_B.weight"].abs().sum() == 0 and zero["x.lora_A.weight"].sum() == 4
