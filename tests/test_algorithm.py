"""The GRPO update as a config group: ART's defaults by default, each knob changing the update as it says,
bad values and unsupported knobs refused before anything loads, and a multirun over presets."""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import math
import random
import shlex
from dataclasses import fields
from pathlib import Path

import pytest

from summrl import algorithm
from summrl.config import SCHEDULE_FIELDS, UNSUPPORTED, AlgorithmConfig
from summrl.errors import ConfigError
from tests.conftest import ROOT, compose_config, heavy_imports, run_cli

LOCAL = ["experiment=local"]


def test_default_algorithm_is_arts_defaults_and_passes_nothing():
    from art.local.backend import LocalBackend
    from art.serverless.backend import ServerlessBackend

    config = compose_config([])
    assert config.algorithm.name == "grpo"
    local = inspect.signature(LocalBackend.train).parameters
    for name in (f.name for f in fields(AlgorithmConfig)):
        if name not in SCHEDULE_FIELDS:  # every knob's default is LocalBackend.train's
            assert getattr(config.algorithm, name) == local[name].default, name
    serverless = inspect.signature(ServerlessBackend.train).parameters
    for name in ("epsilon", "epsilon_high", "advantage_balance", "scale_rewards", "importance_sampling_level"):
        assert getattr(config.algorithm, name) == serverless[name].default, name
    for backend in UNSUPPORTED:
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


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "ppo_clip", "grpo_kl"])
def test_the_training_loop_hands_each_presets_update_and_scheduled_rate_to_the_backend(preset, monkeypatch):
    """Every other test of a preset's update calls the backend's train itself: a loop that dropped the preset's
    arguments trained every preset as plain GRPO, and the multirun over presets stayed green (an audit)."""
    from types import SimpleNamespace

    import summrl.loop
    from summrl.loop import Scored, train_step

    config = compose_config([*LOCAL, f"algorithm={preset}", "algorithm.lr_schedule=linear", "trainer.max_steps=4"])
    sent = []

    async def train(model, groups, **kwargs):
        sent.append(kwargs)
        return SimpleNamespace(metrics={})

    async def sampled(*args, **kwargs):
        return Scored(groups=[])

    monkeypatch.setattr(summrl.loop, "sample_and_score", sampled)
    session = SimpleNamespace(config=config, trainer=config.trainer, reward=None, model=None, stopping=False,
                              backend=SimpleNamespace(train=train))
    asyncio.run(train_step(session, [], 2))
    expected = algorithm.train_kwargs(config.algorithm, config.backend.kind)
    rate = algorithm.learning_rate(config.algorithm, config.model.lr, 2, 4)
    assert sent == [{"learning_rate": rate, **expected}] and rate < config.model.lr
    assert expected == {"grpo": {}, "dr_grpo": {"scale_rewards": False}, "grpo_kl": {"kl_penalty_coef": 0.001},
                        "ppo_clip": {"loss_fn": "ppo", "epsilon": 0.2, "epsilon_high": 0.28}}[preset]


def test_serverless_spells_the_loss_as_ppo_and_refuses_the_kl_penalty():
    ppo = compose_config([*LOCAL, "algorithm=ppo_clip"]).algorithm
    assert algorithm.train_kwargs(ppo, "serverless") == {"ppo": True, "epsilon": 0.2, "epsilon_high": 0.28}
    serverless = [*LOCAL, "backend=serverless", "judge=lexical", "storage.enabled=false", "model=qwen2_5_3b"]
    with pytest.raises(ConfigError, match=r"algorithm.kl_penalty_coef: backend=serverless does not support it "
                                          r"\(ART 0.5.18's ServerlessBackend.train has no such setting\)"):
        compose_config([*serverless, "algorithm=grpo_kl"])
    # the embedded backend (summrl's own) takes every knob, a reference checkpoint included
    embedded = compose_config([*LOCAL, "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=1"]).algorithm
    assert algorithm.train_kwargs(embedded, "embedded") == {"kl_penalty_coef": 0.001, "kl_penalty_reference_step": 1}


@pytest.mark.parametrize("backend", ["local_gpu", "embedded"])
def test_a_kl_reference_at_step_0_is_the_base_model_which_art_calls_none(backend):
    """ART 0.5.18's LocalBackend.train reads any kl_penalty_reference_step but None as the folder checkpoints/<step>,
    and None as the base model (LoRA disabled). Step 0 is the base model to summrl, and storage never backs up
    checkpoints/0000: a run resumed on a fresh machine failed its first step (peft: no adapter_config.json)."""
    from art.local.backend import LocalBackend

    assert inspect.signature(LocalBackend.train).parameters["kl_penalty_reference_step"].default is None
    base = compose_config([*LOCAL, "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=0"]).algorithm
    assert algorithm.train_kwargs(base, backend) == {"kl_penalty_coef": 0.001}


def test_schedule_learning_rate_matches_its_formula():
    lr, steps, warmup = 1e-4, 10, 3
    linear = AlgorithmConfig(lr_schedule="linear", warmup_steps=warmup, min_lr_ratio=0.1)
    cosine = AlgorithmConfig(lr_schedule="cosine", warmup_steps=warmup)
    for schedule in (linear, cosine):
        # warmup: lr x (step + 1) / (warmup + 1), reaching lr at step `warmup`
        assert algorithm.learning_rate(schedule, lr, 0, steps) == pytest.approx(lr / (warmup + 1))
        assert algorithm.learning_rate(schedule, lr, warmup - 1, steps) == pytest.approx(lr * warmup / (warmup + 1))
        assert algorithm.learning_rate(schedule, lr, warmup, steps) == pytest.approx(lr)  # end of warmup
    assert algorithm.learning_rate(linear, lr, steps - 1, steps) == pytest.approx(0.1 * lr)  # the last step
    assert algorithm.learning_rate(cosine, lr, steps - 1, steps) == pytest.approx(0.0, abs=1e-12)
    middle = warmup + (steps - 1 - warmup) / 2
    assert algorithm.learning_rate(cosine, lr, int(middle), steps) == pytest.approx(
        lr * 0.5 * (1 + math.cos(math.pi * (int(middle) - warmup) / (steps - 1 - warmup))))
    assert algorithm.learning_rate(AlgorithmConfig(), lr, 7, steps) == lr
    # edges: one step, or warmup ending at the last step: that step trains at model.lr
    for schedule in ("constant", "linear", "cosine"):
        assert algorithm.learning_rate(AlgorithmConfig(lr_schedule=schedule), lr, 0, 1) == lr
        late = AlgorithmConfig(lr_schedule=schedule, warmup_steps=steps - 1, min_lr_ratio=0.1)
        assert algorithm.learning_rate(late, lr, steps - 1, steps) == pytest.approx(lr)


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.kl_penalty_coef=-0.1"], "algorithm.kl_penalty_coef: must be >= 0"),
    (["algorithm.epsilon=0"], "algorithm.epsilon: must be > 0"),
    (["algorithm.loss_fn=grpo"], "algorithm.loss_fn: must be cispo or ppo"),
    (["algorithm.warmup_steps=5"], "algorithm.warmup_steps: must be < trainer.max_steps (2)"),
    (["algorithm.warmup_steps=2"], "algorithm.warmup_steps: must be < trainer.max_steps (2)"),
    (["algorithm.kl_penalty_reference_step=1"],
     "algorithm.kl_penalty_reference_step: is 1 but algorithm.kl_penalty_coef is 0"),
    (["algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=-1"],
     "algorithm.kl_penalty_reference_step: must be >= 0"),
    (["algorithm.normalize_advantages=false"], "algorithm.normalize_advantages: false turns off scale_rewards"),
])
def test_bad_algorithm_values_fail_fast_naming_the_key(overrides, message, tmp_path):
    result = run_cli([*LOCAL, "trainer.max_steps=2", *overrides, f"hydra.run.dir={tmp_path}/run"], cwd=ROOT,
                     timeout=60, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 2 and message in result.stderr
    assert heavy_imports(result.stderr) == []  # the whole process: nothing heavy is imported before validation
    assert not (tmp_path / "run" / "art").exists()


def test_normalize_advantages_false_is_accepted_with_scale_rewards_false():
    config = compose_config([*LOCAL, "algorithm=dr_grpo", "algorithm.normalize_advantages=false"]).algorithm
    assert algorithm.train_kwargs(config, "local_gpu") == {"scale_rewards": False, "normalize_advantages": False}


def test_skypilot_remote_command_carries_the_algorithm_choice_and_overrides():
    """backend=skypilot runs this job remotely on local_gpu: the algorithm must arrive as it was set here."""
    from summrl.cloud.launch import remote_command

    overrides = ["algorithm=ppo_clip", "algorithm.epsilon_high=0.3", "algorithm.lr_schedule=cosine",
                 "algorithm.warmup_steps=2", "trainer.max_steps=8"]
    config = compose_config(["run.name=ablate", *overrides])
    command = remote_command(config, overrides)
    assert "algorithm=ppo_clip" in command and "algorithm.epsilon_high=0.3" in command
    remote = compose_config(shlex.split(command)[3:])  # as the cluster composes it
    assert remote.backend.kind == "local_gpu"
    assert remote.algorithm == config.algorithm
    assert algorithm.train_kwargs(remote.algorithm, "local_gpu") == {
        "loss_fn": "ppo", "epsilon": 0.2, "epsilon_high": 0.3}
    assert algorithm.learning_rate(remote.algorithm, remote.model.lr, 2, 8) == remote.model.lr


# --------------------------------------------------------------------------- the embedded update, for real
#
# One loaded backend serves every knob test. Each run starts from the same LoRA weights (B = 0: the policy is the
# base model) and a fresh AdamW, and trains on hand-made groups of 4 completions of 8-12 tokens whose sampler
# log-probs are the base model's own, shifted by a chosen delta per token: the importance ratio the loss sees is
# then exp(delta). Every run goes through EmbeddedBackend.train (ART's tokenization, packing and loss, AdamW);
# the only addition is a recorder of the packed tensors that ART's preprocessing hands the engine.

slow = pytest.mark.slow

PROMPTS = [
    "The Harbor Festival in Larkfield drew 300 visitors on June 2, 2024. Fireworks closed the night.",
    "Larkfield's council approved a new library on Maple Street; it opens in March with 12,000 books.",
]
SUMMARIES = [
    ["300 visitors came to the festival.", "Fireworks ended it.", "A festival in Larkfield.", "It rained."],
    ["A library opens in March.", "The council met.", "Maple Street gets 12,000 books.", "Nothing happened."],
]
REWARDS = [1.0, 0.0, 0.75, 0.25]  # advantages +, -, +, - around the mean 0.5
LN = math.log


def fresh(advantage, j, n):
    return 0.0


def outward(advantage, j, n):  # positive advantages at ratio e, negative at 1/e
    return 1.0 if advantage > 0 else -1.0


def far(advantage, j, n):  # ratios e^2 and e^-2
    return 2.0 if advantage > 0 else -2.0


def at_bounds(advantage, j, n):  # exactly 1 + 0.5 and 1 - 0.2
    return LN(1.5) if advantage > 0 else LN(0.8)


def alternating(advantage, j, n):  # token ratios e^0.5, e^-0.5, ...; the sequence's mean log-ratio is 0
    return 0.0 if j == n - 1 and n % 2 else (0.5 if j % 2 == 0 else -0.5)


def up_far(advantage, j, n):  # ratio 3: inside cispo's [0, 5]
    return LN(3.0)


def up_at_cap(advantage, j, n):
    return LN(1.5)


class Bench:
    def __init__(self, tmp: Path):
        import torch

        self.loop = asyncio.new_event_loop()
        _, self.backend, self.model = _backend(tmp, "knobs")
        self.loop.run_until_complete(self.model.register(self.backend))
        self.engine = engine = self.backend.engine
        self.initial = engine.lora_state()
        self.fresh_optimizer = copy.deepcopy(engine.optimizer.state_dict())
        self.packed: list[dict] = []
        train_packed = engine.train_packed

        def recording(packed, *args, **kwargs):  # records what ART packed, then trains on it unchanged
            self.packed.append(packed)
            return train_packed(packed, *args, **kwargs)

        engine.train_packed = recording
        eos = engine.tokenizer.eos_token_id
        self.messages = [[{"role": "system", "content": "Summarize the document in one sentence."},
                          {"role": "user", "content": text}] for text in PROMPTS]
        self.prompts = [engine.encode_chat(m) for m in self.messages]
        self.completions = [[engine.tokenizer.encode(s, add_special_tokens=False) + [eos] for s in summaries]
                            for summaries in SUMMARIES]
        with torch.no_grad():
            self.base = [[self.logprobs(p, c, adapter=False) for c in cs]
                         for p, cs in zip(self.prompts, self.completions)]
        self.cache: dict = {}

    def logprobs(self, prompt: list[int], completion: list[int], adapter: bool = True) -> list[float]:
        """The completion's token log-probs under the current policy (or the base model)."""
        import contextlib

        import torch

        ids = torch.tensor([prompt + completion], device=self.engine.device)
        with torch.no_grad(), (contextlib.nullcontext() if adapter else self.engine.model.disable_adapter()):
            logits = self.engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt):].unsqueeze(1)).squeeze(1).tolist()

    def group(self, index: int, rewards: list[float], delta, sampled: list[list[float]] | None = None):
        """Group ``index`` with these rewards; the sampler's log-probs are the base model's (or ``sampled``) - delta."""
        import art
        from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
        from openai.types.chat.chat_completion import Choice, ChoiceLogprobs

        mean = sum(rewards) / len(rewards)
        trajectories = []
        for completion, base, reward in zip(self.completions[index], sampled or self.base[index], rewards):
            n = len(completion)
            content = [ChatCompletionTokenLogprob(token=f"token_id:{t}", logprob=lp - delta(reward - mean, j, n),
                                                  bytes=[], top_logprobs=[])
                       for j, (t, lp) in enumerate(zip(completion, base))]
            choice = Choice(finish_reason="stop", index=0, logprobs=ChoiceLogprobs(content=content),
                            message=ChatCompletionMessage(role="assistant", content=self.engine.decode(completion)))
            trajectories.append(art.Trajectory(messages_and_choices=[*self.messages[index], choice], reward=reward))
        return art.TrajectoryGroup(trajectories)

    def reset(self) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.engine.model, self.initial)
        self.engine.optimizer.load_state_dict(copy.deepcopy(self.fresh_optimizer))

    def train(self, groups, *, reset: bool = True, save_checkpoint: bool = False, **kwargs):
        """One backend.train step (from the initial weights unless reset=False); its metrics and packed tensors."""
        if reset:
            self.reset()
        random.seed(0)  # ART shuffles trajectories and packed rows: the same order in every run
        self.packed.clear()
        result = self.loop.run_until_complete(self.backend.train(
            self.model, groups, learning_rate=kwargs.pop("learning_rate", 1e-4), save_checkpoint=save_checkpoint,
            **kwargs))
        return result.metrics, list(self.packed)

    def run(self, delta, **kwargs) -> dict:
        """Metrics of one step on the one-group batch (memoized: several tests share a run)."""
        key = (delta.__name__, tuple(sorted(kwargs.items())))
        if key not in self.cache:
            self.cache[key] = self.train([self.group(0, REWARDS, delta)], **kwargs)[0]
        return self.cache[key]

    def drift(self) -> float:
        """Mean |log-prob under the adapter - under the base| over the completions' tokens."""
        diffs = [abs(a - b) for p, cs, bs in zip(self.prompts, self.completions, self.base)
                 for c, base in zip(cs, bs) for a, b in zip(self.logprobs(p, c), base)]
        return sum(diffs) / len(diffs)


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


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    bench = Bench(tmp_path_factory.mktemp("knobs"))
    yield bench
    bench.loop.run_until_complete(bench.backend.close())
    bench.loop.close()


def same_update(a: dict, b: dict) -> bool:
    return (a["loss/train"] == pytest.approx(b["loss/train"], rel=1e-3)
            and a["loss/grad_norm"] == pytest.approx(b["loss/grad_norm"], rel=1e-3))


PPO = {"loss_fn": "ppo", "epsilon": 0.2, "epsilon_high": 0.28}  # algorithm=ppo_clip


@slow
def test_ppo_clipped_surrogate_drops_the_gradient_beyond_the_clip_where_cispo_keeps_it(bench):
    # Every ratio lies beyond the clip in its advantage's direction (e > 1.28 where A > 0, 1/e < 0.8 where A < 0):
    # min(r A, clip(r) A) takes the constant clipped branch, so PPO's gradient is zero and the adapter stays put.
    ppo = bench.run(outward, **PPO)
    assert ppo["loss/grad_norm"] == 0.0 and ppo["loss/clipped_fraction"] == 1.0
    # CISPO keeps every token's gradient, weighted by its clipped ratio (e and 1/e lie inside [0, 5]).
    cispo = bench.run(outward)
    assert cispo["loss/grad_norm"] > 1e-3 and cispo["loss/clipped_fraction"] == 0.0
    # At ratio 1 both are the plain policy gradient: equal gradients, different loss values (-A r vs -A log p).
    ppo_fresh, cispo_fresh = bench.run(fresh, **PPO), bench.run(fresh)
    assert ppo_fresh["loss/grad_norm"] == pytest.approx(cispo_fresh["loss/grad_norm"], rel=1e-3)
    assert ppo_fresh["loss/train"] != pytest.approx(cispo_fresh["loss/train"], rel=1e-2)


@slow
def test_a_ppo_step_with_every_token_clipped_leaves_the_adapter_where_cispo_moves_it(bench):
    def moved() -> float:
        after = bench.engine.lora_state()
        return max(float((after[k] - bench.initial[k]).abs().max()) for k in after)

    bench.train([bench.group(0, REWARDS, outward)], **PPO)
    assert moved() == 0.0
    bench.train([bench.group(0, REWARDS, outward)])
    assert moved() > 0.0


@slow
def test_epsilon_and_epsilon_high_bound_the_ratio_the_loss_uses(bench):
    # Ratios e^2 and e^-2 with the clip [1 - 0.2, 1 + 0.5] train exactly like ratios 1.5 and 0.8 unclipped.
    tight = bench.run(far, epsilon=0.2, epsilon_high=0.5)
    assert same_update(tight, bench.run(at_bounds))
    assert tight["loss/clipped_fraction"] == 1.0 and bench.run(at_bounds)["loss/clipped_fraction"] == 0.0
    assert not same_update(bench.run(at_bounds), bench.run(fresh))  # the ratio does change the update


@slow
def test_importance_sampling_level_sequence_uses_each_completions_mean_ratio(bench):
    # Per-token ratios alternate e^0.5, e^-0.5 (outside [0.8, 1.2]); each completion's mean log-ratio is 0.
    clip = {"epsilon": 0.2, "epsilon_high": 0.2}
    token = bench.run(alternating, **clip)
    sequence = bench.run(alternating, importance_sampling_level="sequence", **clip)
    assert same_update(sequence, bench.run(fresh))  # the sequence ratio, exp(0) = 1, weighs every token
    assert not same_update(token, bench.run(fresh))  # the token ratios are clipped to 1.2 and 0.8
    lengths = [len(c) for c in bench.completions[0]]  # every token but an odd completion's last is clipped
    assert sequence["loss/clipped_fraction"] == 0.0
    assert token["loss/clipped_fraction"] == pytest.approx(sum(n - n % 2 for n in lengths) / sum(lengths))


@slow
def test_max_negative_advantage_importance_sampling_weight_caps_the_ratio(bench):
    # Every ratio is 3 (inside cispo's [0, 5]); the cap 1.5 makes the step that of ratio 1.5. ART 0.5.18 caps
    # every token's ratio, whatever its advantage's sign.
    capped = bench.run(up_far, max_negative_advantage_importance_sampling_weight=1.5)
    assert same_update(capped, bench.run(up_at_cap))
    assert not same_update(bench.run(up_far), bench.run(up_at_cap))
    assert capped["loss/clipped_fraction"] == 1.0 and bench.run(up_far)["loss/clipped_fraction"] == 0.0


def _token_advantages(packed: list[dict]):
    import torch

    return torch.cat([p["advantages"][p["assistant_mask"]] for p in packed])


@slow
def test_advantage_balance_shrinks_negative_or_positive_advantages(bench):
    import torch

    group = [bench.group(0, REWARDS, fresh)]
    balanced = _token_advantages(bench.train(group)[1])
    negative, positive = balanced < 0, balanced > 0
    for balance in (0.5, -0.5):
        ratio = _token_advantages(bench.train(group, advantage_balance=balance)[1]) / balanced
        # one factor per sign (ART then rescales all advantages to mean |A| = 1)
        on_negative, on_positive = ratio[negative], ratio[positive]
        assert torch.allclose(on_negative, on_negative[0]) and torch.allclose(on_positive, on_positive[0])
        shrunk, kept = (on_negative[0], on_positive[0]) if balance > 0 else (on_positive[0], on_negative[0])
        assert float(shrunk / kept) == pytest.approx(1 - abs(balance), rel=1e-4)


@slow
def test_scale_rewards_false_makes_advantages_reward_minus_group_mean(bench):
    import torch

    narrow = [r / 10 for r in REWARDS]  # a second group with a 10x narrower reward spread
    groups = lambda: [bench.group(0, REWARDS, fresh), bench.group(1, narrow, fresh)]  # noqa: E731

    def expected(scale: bool) -> torch.Tensor:  # each completion's advantage, once per token
        out = []
        for rewards, completions in ((REWARDS, bench.completions[0]), (narrow, bench.completions[1])):
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
            out += [(r - mean) / (std + 1e-6 if scale else 1.0) for r, c in zip(rewards, completions) for _ in c]
        return torch.tensor(sorted(out))

    runs = {"scaled": bench.train(groups())[1], "unscaled": bench.train(groups(), scale_rewards=False)[1],
            "alias": bench.train(groups(), normalize_advantages=False)[1]}
    for name, packed in runs.items():
        got, want = _token_advantages(packed).sort().values, expected(name == "scaled")
        factor = got.abs().mean() / want.abs().mean()  # ART's packing rescales all advantages to mean |A| = 1
        assert torch.allclose(got, want * factor, rtol=1e-4, atol=1e-5), name
    assert torch.equal(_token_advantages(runs["alias"]), _token_advantages(runs["unscaled"]))  # LocalBackend's alias


@slow
def test_kl_penalty_shifts_each_tokens_advantage_by_its_log_ratio_to_the_base_model(bench):
    # ART's definition (art/loss.py): with k_t = log p(t) - log p_ref(t) over a packed sequence's completion tokens,
    # each token's advantage gains coef x (mean k - k_t), and loss/kl_policy_ref logs mean k.
    bench.reset()
    for _ in range(2):  # move the policy away from the base
        bench.train([bench.group(0, REWARDS, fresh)], reset=False, learning_rate=1e-3)
    prompt, completions = bench.prompts[0], bench.completions[0]
    policy = [bench.logprobs(prompt, c) for c in completions]
    # sampled by this policy (ratio 1, weight 1); lr 0 measures the loss without moving the adapter
    group = lambda: [bench.group(0, REWARDS, fresh, sampled=policy)]  # noqa: E731
    plain = bench.train(group(), reset=False, learning_rate=0.0)[0]
    coef = 0.5
    penalized = bench.train(group(), reset=False, learning_rate=0.0, kl_penalty_coef=coef)[0]
    k = [[x - ref for x, ref in zip(lp, base)] for lp, base in zip(policy, bench.base[0])]  # reference: the base
    mean_k = sum(map(sum, k)) / sum(map(len, k))
    assert penalized["loss/kl_policy_ref"] == pytest.approx(mean_k, rel=1e-3) and abs(mean_k) > 0.1
    # cispo's loss, -sum(w A log p) / tokens with ART's per-completion weight w = tokens / (completions x its length)
    # (each completion counts once), gains -coef/completions x sum over completions of mean((mean k - k_t) log p_t)
    shift = -coef / len(k) * sum(sum((mean_k - kt) * lp for kt, lp in zip(ks, lps)) / len(ks)
                                 for ks, lps in zip(k, policy))
    assert penalized["loss/train"] - plain["loss/train"] == pytest.approx(shift, rel=1e-3, abs=1e-4)
    assert abs(shift) > 1e-2 and "loss/kl_policy_ref" not in plain  # no reference pass without a penalty


@slow
def test_kl_reference_step_is_that_checkpoint_and_the_trained_adapter_is_put_back(bench):
    import torch

    group = lambda: [bench.group(0, REWARDS, fresh)]  # noqa: E731
    kl = {"kl_penalty_coef": 0.1, "learning_rate": 0.0}  # lr 0: measures the KL without moving the adapter
    bench.train(group(), learning_rate=1e-3, save_checkpoint=True)  # checkpoint 1: the policy now
    step = bench.loop.run_until_complete(bench.model.get_step())
    at_checkpoint = bench.train(group(), reset=False, kl_penalty_reference_step=step, **kl)[0]["loss/kl_policy_ref"]
    to_base = bench.train(group(), reset=False, **kl)[0]["loss/kl_policy_ref"]
    # the policy is checkpoint `step`, and has moved from the base (the mean log-ratio on these fixed tokens)
    assert abs(at_checkpoint) < 1e-4 < abs(to_base)
    bench.train(group(), reset=False, learning_rate=1e-3)  # one more step past the checkpoint
    before = bench.engine.lora_state()
    moved = bench.train(group(), reset=False, kl_penalty_reference_step=step, **kl)[0]["loss/kl_policy_ref"]
    after = bench.engine.lora_state()
    assert abs(moved) > 1e-3  # measured from the trained adapter, not the checkpoint swapped in for the reference
    assert all(torch.equal(before[k], after[k]) for k in before)  # and that adapter is put back exactly
    with pytest.raises(ValueError, match=r"algorithm.kl_penalty_reference_step=99: this run has no checkpoint 99"):
        bench.train(group(), reset=False, kl_penalty_reference_step=99, **kl)


@slow
def test_scheduled_learning_rate_reaches_the_optimizer(bench):
    # AdamW's first step from a fresh state moves each weight by lr x g / (|g| + eps): the largest move is lr.
    config = compose_config([*LOCAL, "trainer.max_steps=5", "model.lr=1e-3", "algorithm.lr_schedule=linear",
                             "algorithm.warmup_steps=2", "algorithm.min_lr_ratio=0.1"])
    for step, want in ((0, 1e-3 / 3), (2, 1e-3), (4, 1e-4)):  # step 0, the end of warmup, the last step
        lr = algorithm.learning_rate(config.algorithm, config.model.lr, step, config.trainer.max_steps)
        assert lr == pytest.approx(want)
        metrics, _ = bench.train([bench.group(0, REWARDS, fresh)], learning_rate=lr)
        after = bench.engine.lora_state()
        moved = max(float((after[k] - bench.initial[k]).abs().max()) for k in after)
        assert moved == pytest.approx(lr, rel=1e-3)
        assert metrics["loss/learning_rate"] == pytest.approx(lr)


@slow
def test_multirun_over_presets_records_each_choice(shared_sweep):
    """conftest.shared_sweep runs algorithm=grpo,dr_grpo."""
    jobs = shared_sweep.jobs()
    for preset in ("grpo", "dr_grpo"):
        job = jobs[(preset, 2)]
        record = json.loads((job / "result.json").read_text())
        assert record["status"] == "completed" and record["choices"]["algorithm"] == preset
        assert record["algorithm"]["name"] == preset
        assert record["algorithm"]["scale_rewards"] is (preset == "grpo")
        assert record["sweep_varied"] == ["algorithm", "dataset.train_size"]  # conftest.SWEEP_ARMS: fixed from now on
        history = [json.loads(line) for line in next(job.glob("art/*/models/*/history.jsonl")).open()]
        assert any(h.get("loss/learning_rate") == 5e-4 for h in history)


@slow
def test_a_checkpoints_files_are_on_disk_before_the_rename_makes_it_the_checkpoint(bench, tmp_path, monkeypatch):
    """A power cut after the rename must not leave a checkpoint folder of empty files that resume then trusts."""
    import os

    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append(("replace", str(src))), replace(src, dst))[1])
    bench.engine.save_checkpoint(tmp_path / "0001")
    renamed = [i for i, (kind, _) in enumerate(events) if kind == "replace"]
    assert len(renamed) == 1
    tmp = events[renamed[0]][1]
    synced = {Path(path).name for kind, path in events[:renamed[0]] if kind == "fsync" and path.startswith(tmp + "/")}
    saved = {p.name for p in (tmp_path / "0001").iterdir()}
    assert {"adapter_model.safetensors", "optimizer.pt"} <= saved and synced == saved


@slow
@pytest.mark.parametrize("knobs", [{}, PPO], ids=["cispo", "ppo_clip"])
def test_a_step_raises_the_rewarded_summaries_and_lowers_the_others(bench, knobs):
    """The update's direction: after one step on rewards [1, 0, .75, .25], the best summary is likelier under the
    policy, the worst less likely, and the four moved in the order of their advantages (+.5, +.25, -.25, -.5; the
    summaries share the adapter, so a small advantage's can go either way). Every other test here is blind to the
    sign: a negated loss trained away from what the reward asked and passed them all."""
    bench.train([bench.group(0, REWARDS, fresh)], **knobs)
    moved = [sum(bench.logprobs(bench.prompts[0], c)) - sum(base)
             for c, base in zip(bench.completions[0], bench.base[0])]
    assert moved[0] > 0 > moved[1], moved
    assert moved[0] > moved[2] > moved[3] > moved[1], moved
    bench.reset()
