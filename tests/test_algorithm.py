"""The GRPO update as a config group: ART's defaults by default, each knob changing the update as it says,
bad values and unsupported knobs refused before anything loads, and a multirun over presets."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import time
from dataclasses import fields
from pathlib import Path

import pytest

from summrl import algorithm
from summrl.config import AlgorithmConfig, ConfigError
from tests.conftest import ROOT, compose_config, run_cli

LOCAL = ["experiment=local"]


def test_default_algorithm_is_arts_defaults_and_passes_nothing():
    from art.local.backend import LocalBackend
    from art.serverless.backend import ServerlessBackend

    config = compose_config([])
    assert config.algorithm.name == "grpo"
    local = inspect.signature(LocalBackend.train).parameters
    for name in (f.name for f in fields(AlgorithmConfig)):
        if name not in algorithm.SCHEDULE_FIELDS:  # every knob's default is LocalBackend.train's
            assert getattr(config.algorithm, name) == local[name].default, name
    serverless = inspect.signature(ServerlessBackend.train).parameters
    for name in ("epsilon", "epsilon_high", "advantage_balance", "scale_rewards", "importance_sampling_level"):
        assert getattr(config.algorithm, name) == serverless[name].default, name
    for backend in algorithm.UNSUPPORTED:
        assert algorithm.train_kwargs(config.algorithm, backend) == {}
    assert {algorithm.learning_rate(config.algorithm, 5e-5, step, 40) for step in (0, 20, 39)} == {5e-5}


@pytest.mark.parametrize("preset,kwargs", [
    ("grpo", {}),
    ("dr_grpo", {"scale_rewards": False}),
    ("ppo_clip", {"loss_fn": "ppo", "epsilon": 0.2, "epsilon_high": 0.28}),
    ("grpo_kl", {"kl_penalty_coef": 0.001}),
])
def test_presets_compose_into_backend_train_arguments(preset, kwargs):
    config = compose_config([*LOCAL, f"algorithm={preset}"])
    assert config.algorithm.name == preset
    assert algorithm.train_kwargs(config.algorithm, "local_gpu") == kwargs


def test_serverless_spells_the_loss_as_ppo_and_refuses_the_kl_penalty():
    ppo = compose_config([*LOCAL, "algorithm=ppo_clip"]).algorithm
    assert algorithm.train_kwargs(ppo, "serverless") == {"ppo": True, "epsilon": 0.2, "epsilon_high": 0.28}
    with pytest.raises(ConfigError, match="algorithm.kl_penalty_coef: backend=serverless does not support it"):
        compose_config([*LOCAL, "backend=serverless", "judge=lexical", "storage.enabled=false", "algorithm=grpo_kl"])
    with pytest.raises(ConfigError, match="algorithm.kl_penalty_reference_step: backend=embedded"):
        compose_config([*LOCAL, "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=2"])


def test_schedule_learning_rate_matches_its_formula():
    lr, steps, warmup = 1e-4, 10, 3
    linear = AlgorithmConfig(lr_schedule="linear", warmup_steps=warmup, min_lr_ratio=0.1)
    cosine = AlgorithmConfig(lr_schedule="cosine", warmup_steps=warmup)
    for schedule in (linear, cosine):
        assert algorithm.learning_rate(schedule, lr, 0, steps) == pytest.approx(lr / (warmup + 1))
        assert algorithm.learning_rate(schedule, lr, warmup, steps) == pytest.approx(lr)  # end of warmup
    assert algorithm.learning_rate(linear, lr, steps - 1, steps) == pytest.approx(0.1 * lr)  # the last step
    assert algorithm.learning_rate(cosine, lr, steps - 1, steps) == pytest.approx(0.0, abs=1e-12)
    middle = warmup + (steps - 1 - warmup) / 2
    assert algorithm.learning_rate(cosine, lr, int(middle), steps) == pytest.approx(
        lr * 0.5 * (1 + math.cos(math.pi * (int(middle) - warmup) / (steps - 1 - warmup))))
    assert algorithm.learning_rate(AlgorithmConfig(), lr, 7, steps) == lr


@pytest.mark.parametrize("override,message", [
    ("algorithm.kl_penalty_coef=-0.1", "algorithm.kl_penalty_coef: must be >= 0"),
    ("algorithm.epsilon=0", "algorithm.epsilon: must be > 0"),
    ("algorithm.loss_fn=grpo", "algorithm.loss_fn: must be cispo or ppo"),
    ("algorithm.warmup_steps=5", "algorithm.warmup_steps: must be <= trainer.max_steps (2)"),
])
def test_bad_algorithm_values_fail_fast_naming_the_key(override, message, tmp_path):
    started = time.monotonic()
    result = run_cli([*LOCAL, "trainer.max_steps=2", override, f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 2 and message in result.stderr
    assert elapsed < 2.0  # the whole process: nothing heavy is imported before validation
    assert not (tmp_path / "run" / "art").exists()


# --------------------------------------------------------------------------- the embedded update, for real

slow = pytest.mark.slow


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def sampled(loop, tmp_path_factory):
    """Two hand-rewarded groups of real rollouts (short), sampled once and reused by every test."""
    import art

    from summrl.data import load_splits
    from summrl.rollout import rollout

    config, backend, model = _backend(tmp_path_factory.mktemp("sample"), "sampler")
    loop.run_until_complete(model.register(backend))
    _, docs = load_splits(config.dataset)
    groups = loop.run_until_complete(art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, d, max_words=350, max_tokens=16, temperature=1.0) for _ in range(4))
         for d in docs[:2]], pbar_desc=None))
    for t, r in zip(groups[0].trajectories, [0.0, 1.0, 0.5, 0.25]):
        t.reward = r
    for t, r in zip(groups[1].trajectories, [0.0, 0.1, 0.05, 0.0]):  # a 10x narrower spread
        t.reward = r
    yield groups, backend
    loop.run_until_complete(backend.close())


def _backend(tmp: Path, name: str):
    import art
    import torch

    from summrl.backends.embedded import EmbeddedBackend

    config = compose_config(LOCAL)
    torch.manual_seed(0)  # the same LoRA initialisation for every backend built here
    backend = EmbeddedBackend(config.backend, model=config.model, path=str(tmp / "art"))
    model = art.TrainableModel(name=name, project="summrl-tests", base_model=config.model.base_model,
                               report_metrics=[])
    return config, backend, model


def _copy(groups):
    return [g.model_copy(deep=True) for g in groups]


@slow
def test_scale_rewards_false_makes_advantages_reward_minus_group_mean(sampled):
    groups, backend = sampled
    for scale in (False, True):
        expected = []
        for g in groups:
            rewards = [t.reward for t in g.trajectories]
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
            expected += [(r - mean) / ((std + 1e-6) if scale else 1.0) for r in rewards if r != mean]
        got = [r.advantage for r in backend.tokenize(_copy(groups), scale_rewards=scale)]
        assert sorted(got) == pytest.approx(sorted(expected), abs=1e-6)
    # packed: the narrow group's advantages stay 10x smaller without std scaling, equal in size with it
    import torch

    def row_scale(packed, row):
        adv = packed["advantages"][row][packed["assistant_mask"][row]]
        return float(adv.abs().max())

    flat = backend._pack(_copy(groups), scale_rewards=False)
    scaled = backend._pack(_copy(groups), scale_rewards=True)
    assert flat["tokens"].shape[0] == 2
    ratio_flat = row_scale(flat, 1) / row_scale(flat, 0)
    ratio_scaled = row_scale(scaled, 1) / row_scale(scaled, 0)
    assert min(ratio_flat, 1 / ratio_flat) < 0.15 and min(ratio_scaled, 1 / ratio_scaled) > 0.5
    assert torch.isfinite(flat["advantages"]).all()


@slow
def test_epsilon_bounds_the_importance_ratio(loop, sampled, tmp_path):
    groups, _ = sampled
    stale = _copy(groups)
    for g in stale:  # the sampler's log-probs one nat lower: every ratio is about e = 2.7
        for t in g.trajectories:
            for token in t.messages_and_choices[-1].logprobs.content:
                token.logprob -= 1.0
    clipped = {}
    for name, kwargs in {"default": {}, "tight": {"epsilon": 0.2, "epsilon_high": 0.5}}.items():
        _, backend, model = _backend(tmp_path / name, f"eps-{name}")
        loop.run_until_complete(model.register(backend))
        result = loop.run_until_complete(backend.train(model, _copy(stale), learning_rate=1e-4, **kwargs))
        clipped[name] = result.metrics["loss/clipped_fraction"]
        loop.run_until_complete(backend.close())
    assert clipped["default"] == 0.0  # ART's cispo bounds [0, 5] hold e
    assert clipped["tight"] > 0.9  # [0.8, 1.5] does not


@slow
def test_kl_penalty_keeps_the_adapter_closer_to_the_base(loop, sampled, tmp_path):
    import torch

    groups, _ = sampled
    drift, kl_logged = {}, {}
    for coef in (0.0, 5.0):
        _, backend, model = _backend(tmp_path / str(coef), f"kl-{coef}")
        loop.run_until_complete(model.register(backend))
        for _ in range(4):
            result = loop.run_until_complete(backend.train(model, _copy(groups), learning_rate=2e-3,
                                                           kl_penalty_coef=coef, save_checkpoint=False))
        kl_logged[coef] = result.metrics.get("loss/kl_policy_ref")
        packed = backend._pack(_copy(groups))
        engine = backend.engine
        diffs = []
        with torch.no_grad():
            for row in range(packed["tokens"].shape[0]):
                inputs = {k: v[row:row + 1] for k, v in packed.items() if isinstance(v, torch.Tensor)}
                new = engine.completion_logprobs(inputs)
                with engine.model.disable_adapter():
                    base = engine.completion_logprobs(inputs)
                mask = torch.nn.functional.pad(inputs["assistant_mask"][:, 1:], (0, 1), value=False)
                diffs.append((new - base)[mask].abs())
        drift[coef] = float(torch.cat(diffs).mean())
        loop.run_until_complete(backend.close())
    assert kl_logged[0.0] is None and kl_logged[5.0] is not None  # the reference pass runs only with a penalty
    assert drift[5.0] < drift[0.0], drift


@slow
def test_multirun_over_presets_records_each_choice(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_cli(["-m", *LOCAL, "algorithm=grpo,dr_grpo", "trainer.max_steps=1", "trainer.max_summary_tokens=8",
                      "dataset.val_size=1", "trainer.val_rollouts_per_doc=2", f"hydra.sweep.dir={sweep}"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    for job, preset in (("0", "grpo"), ("1", "dr_grpo")):
        record = json.loads((sweep / job / "result.json").read_text())
        assert record["status"] == "completed" and record["choices"]["algorithm"] == preset
        assert record["algorithm"]["name"] == preset
        assert record["algorithm"]["scale_rewards"] is (preset == "grpo")
        history = [json.loads(line) for line in next(sweep.glob(f"{job}/art/*/models/*/history.jsonl")).open()]
        assert any(h.get("train/algorithm/learning_rate") == 5e-4 for h in history)
