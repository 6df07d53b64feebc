"""Every group option and experiment composes against its schema; bad values fail early and clearly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from summrl.errors import ConfigError
from tests.conftest import CONF, ROOT, compose_config, compose_raw, group_options, run_cli

GROUPS = ["model", "dataset", "reward", "judge", "backend", "logger", "algorithm"]
# An offline base so that the group under test is the only choice that varies.
LOCAL = ["experiment=local"]


# Choices that need another group's option beside them: judge=local runs on the embedded backend only.
# GPU backends load model.base_model from the hub: experiment=local's model.weights (a .gguf) is the embedded engine's.
NEEDS = {("backend", b): ["judge=lexical", "model.weights=null"] for b in group_options("backend") if b != "embedded"}
NEEDS[("backend", "serverless")] = ["judge=lexical", "model=qwen2_5_3b"]  # W&B chooses the adapter: no model.lora
NEEDS[("dataset", "documents")] = ["dataset.path=tests/fixtures/documents"]  # your documents: where they are


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in group_options(g)])
def test_every_group_option_composes_against_its_schema(group, option):
    from omegaconf import OmegaConf

    from summrl.config import KIND_SCHEMAS, WeightedRewardConfig

    raw = OmegaConf.load(CONF / group / f"{option}.yaml")  # the option's own file: the kind or name it sets
    config = compose_config([*LOCAL, *NEEDS.get((group, option), []), f"{group}={option}"])
    section = getattr(config, group)
    if group in KIND_SCHEMAS:
        kind = raw.get("kind") or next(d for d in raw.defaults if str(d).startswith("base_"))[len("base_"):]
        schema = WeightedRewardConfig if kind == "length_penalized" else KIND_SCHEMAS[group][kind]  # made weighted
        assert type(section) is schema
    else:
        assert section.name == raw.get("name", option)


def test_ruler_needs_an_llm_judge():
    with pytest.raises(ConfigError, match=r"a RULER reward \(reward=ruler, or a ruler term or base of the reward\) "
                                          r"needs an LLM judge.*judge=local"):
        compose_config([*LOCAL, "judge=lexical", "reward=ruler"])
    with pytest.raises(ConfigError, match="a RULER reward .* needs an LLM judge"):  # it named reward=ruler, not given
        compose_config([*LOCAL, "judge=lexical", "reward=length_penalized", "reward.base=ruler"])
    # the embedded judges are offered only where they run: on a cloud GPU the next check refused them
    with pytest.raises(ConfigError, match="judge=openai_compatible$"):
        compose_config(["judge=lexical", "reward=ruler"])
    # "" read as no cache: a resume paid again for every reply (an audit); null is the way to say it
    with pytest.raises(ConfigError, match="judge.cache_dir: is empty: name a folder, or null"):
        compose_config([*LOCAL, "judge=gemini_flash", "judge.cache_dir=''"])
    assert compose_config([*LOCAL, "judge=gemini_flash", "judge.cache_dir=null"]).judge.cache_dir is None
    # a server's URL without its scheme was taken: every call failed as a connection error once the model had loaded
    # and val had run, with "rerun the same command" for a fix (found by this stop's SFT audit)
    for key, extra in (("judge.api_base", ["judge=openai_compatible"]),
                       ("sft.teacher.api_base", ["sft=distill", "sft.teacher.model=openai/served"])):
        for url in ("localhost:8000/v1", "http://:8000/v1", "http://host:port/v1"):
            with pytest.raises(ConfigError, match=rf"^{key}: must be an http:// or https:// URL with a host, e.g. "
                                                  rf"http://localhost:8000/v1; got '{url}'$"):
                compose_config([*LOCAL, *extra, f"{key}={url}"])
        assert compose_config([*LOCAL, *extra, f"{key}=http://localhost:8000/v1"]) is not None
    with pytest.raises(ConfigError, match="got dataset=repliqa_sample: remove it"):  # the option, not its kind
        compose_config([*LOCAL, "trainer.min_new_documents=2"])
    # the local experiment's judge pairs lexical QA grading with the embedded model for RULER
    assert compose_config([*LOCAL, "reward=ruler"]).judge.kind == "local"


def test_embedded_judges_need_the_embedded_backend():
    for judge in ("embedded", "local"):
        with pytest.raises(ConfigError, match=f"judge={judge} uses the embedded backend's model.*backend=embedded"):
            compose_config([*LOCAL, f"judge={judge}", "backend=local_gpu"])


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_job_of_every_experiment_composes_with_its_swept_values(experiment):
    """A sweep's jobs are what users run: each one of its grid composes, validates and has the value it sweeps."""
    import itertools

    from omegaconf import OmegaConf

    from summrl.config import validate

    cfg, _ = compose_raw([f"experiment={experiment}"])
    params = dict(OmegaConf.select(cfg, "hydra.sweeper.params") or {})
    assert bool(params) == (str(cfg.hydra.mode) == "RunMode.MULTIRUN")
    for job in itertools.product(*[[(key, value) for value in str(values).split(",")] for key, values in params.items()]):
        cfg, choices = compose_raw([f"experiment={experiment}", *(f"{key}={value}" for key, value in job)])
        validate(cfg)
        for key, value in job:
            got = choices[key] if key in choices else OmegaConf.select(cfg, key)
            assert got == type(got)(value), (experiment, key, value, got)


def test_sweeps_as_config_set_multirun_and_their_grid():
    cfg, _ = compose_raw(["experiment=reward_ablation_local"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert dict(cfg.hydra.sweeper.params) == {"reward": "qa,length_penalized,ruler"}
    assert cfg.model.name == "smollm2_135m" and cfg.judge.kind == "local"  # on top of experiment=local
    cfg, _ = compose_raw(["experiment=reward_ablation"])
    assert dict(cfg.hydra.sweeper.params) == {"reward": "qa,length_penalized,ruler", "model.lr": "5e-5,1e-5",
                                              "seed": "80,81"}


def test_defaults_reproduce_summary_rl():
    cfg, choices = compose_raw([])
    assert choices["model"] == "qwen2_5_3b" and cfg.model.base_model == "Qwen/Qwen2.5-3B-Instruct"
    assert (choices["dataset"], choices["reward"], choices["judge"], choices["backend"]) == (
        "repliqa", "qa", "gemini_flash", "skypilot")
    assert cfg.trainer.max_words == 350
    assert cfg.dataset.seed == 80


def test_the_default_prompt_is_summary_rls_word_for_word_and_local_runs_keep_theirs():
    """The policy's messages by default are OpenPipe/Summary-RL's (src/summarizer/rollout.py), quoted here as that file
    has them: no word limit, no hint of what the questions ask. experiment=local and its ablations keep the prompt
    every recorded local result used (the limit and the facts to keep)."""
    from summrl.data import Document
    from summrl.prompt import SummaryPrompt

    document = Document(id="d", topic="", text="A {braced} text.", questions=())
    default = SummaryPrompt.of(compose_config([]).trainer)
    assert default.messages(document) == [
        {"role": "system", "content": """
You are a specialized AI assistant that generates concise, informative summaries for documents.
"""},
        {"role": "user", "content": f"""You are a specialized AI assistant that generates concise, informative summaries for documents.

Here is a document: {document.text}

Generate a summary that conveys all relevant information in a concise manner."""},
    ]
    for experiment in ("local", "reward_ablation_local", "algorithm_ablation_local", "sft_ablation_local"):
        trainer = compose_config([f"experiment={experiment}", "trainer.max_words=40"]).trainer
        assert SummaryPrompt.of(trainer).messages(document) == [
            {"role": "system", "content": "You are a specialized AI assistant that writes concise, informative "
                                          "summaries of documents."},
            {"role": "user", "content": "Here is a document:\n\nA {braced} text.\n\nWrite a summary of this document "
                                        "in at most 40 words. Keep the concrete facts a reader could ask about: "
                                        "names, dates, numbers, places and outcomes."},
        ], experiment
    with pytest.raises(ConfigError, match=r"trainer.prompt: must be one of summary_rl, facts \(summrl/prompt.py\), "
                                          r"got 'short'"):
        compose_config(["trainer.prompt=short"])


def test_a_run_saved_before_trainer_prompt_is_served_and_exported_with_the_prompt_it_trained_on(tmp_path):
    """Runs recorded before trainer.prompt existed were asked facts's prompt: summrl.serve, export and the benchmark
    read their config as that, not as today's default."""
    from omegaconf import OmegaConf

    from summrl.checkpoints import TrainedRun, run_config
    from summrl.config import compose

    for saved, read in (("absent", "facts"), ("summary_rl", "summary_rl"), ("facts", "facts")):
        cfg = OmegaConf.to_container(compose("train", [*LOCAL, "run.dir=x", "run.name=r"]))  # as Hydra saves it
        if saved == "absent":
            del cfg["trainer"]["prompt"]
        else:
            cfg["trainer"]["prompt"] = saved
        (tmp_path / saved / ".hydra").mkdir(parents=True)
        OmegaConf.save(cfg, tmp_path / saved / ".hydra" / "config.yaml")
        run = TrainedRun(run_dir=tmp_path / saved, name="r", checkpoints_dir=tmp_path / saved, steps=[])
        assert run_config(run).trainer.prompt == read, saved


def test_local_experiment_is_the_embedded_default():
    config = compose_config(LOCAL)
    assert config.model.name == "smollm2_135m"
    assert config.dataset.name == "repliqa_sample"
    assert config.backend.kind == "embedded"
    assert config.judge.kind == "local"  # lexical QA grading, the embedded model for RULER
    assert config.trainer.max_summary_tokens <= 256


def test_cli_overrides_reach_typed_config():
    config = compose_config([*LOCAL, "model.lr=1e-5", "trainer.max_steps=3"])
    assert config.model.lr == pytest.approx(1e-5)
    assert isinstance(config.trainer.max_steps, int) and config.trainer.max_steps == 3


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.lr=abc", "model.lr"),
        ("trainer.max_steps=-1", "trainer.max_steps: must be > 0"),
        ("+trainer.max_stepz=3", "Did you mean trainer.max_steps"),
        ("model.lr=0", "model.lr: must be > 0"),
        ("trainer.rollouts_per_group=1", "at least 2"),
        ("backend.dtype=float8", "backend.dtype"),
        ("backend.num_threads=0", r"backend.num_threads: must be > 0 or null"),
        ("seed=-3", r"seed: must be in \[0, 2\*\*32 - 1\]"),
        ("seed=4294967296", r"seed: must be in \[0, 2\*\*32 - 1\]"),
        ("trainer.missing_reward_window=0", "trainer.missing_reward_window: must be > 0"),
        ("dataset.val_size='-1'", r"dataset.val_size: must be > 0 \(a count"),  # as VAL_SIZE=-1 gives it: a string
        ("trainer.val_temperature=-0.5", r"trainer.val_temperature: must be in \[0, 2\] or null"),
        ("trainer.val_temperature=0", "trainer.val_rollouts_per_doc: greedy val .* set trainer.val_rollouts_per_doc=1"),
        # each was accepted, and named runs, tags or report rows with nothing (an options audit)
        ("model.name=", "model.name: must not be empty"),
        ("algorithm.name=", "algorithm.name: must not be empty"),
        ("dataset.hf_split=", "dataset.hf_split: must not be empty"),
        ("logger=wandb logger.entity=", r"logger.entity: must name a W&B team or user, or be null"),
        # an infinite weight made every reward inf or nan
        ("reward=weighted reward.terms.qa.weight=inf", r"reward.terms.qa.weight: must be a finite number, got inf"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        compose_config([*LOCAL, *override.split()])


@pytest.mark.parametrize("overrides,message", [
    # each passed validation, then trained nothing, hung, or ran something other than what the config said
    (["trainer.temperature=0"], r"trainer.temperature: is 0 \(greedy\): every summary of a group would be the same"),
    (["judge=embedded", "judge.max_concurrency=0"], r"judge.max_concurrency: must be > 0, got 0"),  # waited forever
    (["judge.retry_base_s=-1"], r"judge.retry_base_s: must be >= 0"),
    (["sft=best_of_n", "sft.teacher.retry_max_s=-2"], r"sft.teacher.retry_max_s: must be >= 0"),
    (["algorithm.min_lr_ratio=0.1"], r"algorithm.min_lr_ratio: is 0.1, but algorithm.lr_schedule=constant never "
                                     r"decays"),
    (["algorithm.lr_schedule=cosine", "algorithm.min_lr_ratio=1.0"],
     r"algorithm.min_lr_ratio: is 1, so algorithm.lr_schedule=cosine never decays"),
    (["algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=17"],
     r"algorithm.kl_penalty_reference_step: is 17, but this run's last checkpoint is 16 \(trainer.max_steps\)"),
    (["algorithm=grpo_kl", "sft=best_of_n", "algorithm.kl_penalty_reference_step=18"],
     r"last checkpoint is 17 \(trainer.max_steps \+ the SFT step\)"),
    (["dataset=inbox", "reward=ruler", "dataset.max_document_tokens=0"], r"dataset.max_document_tokens: must be > 0"),
    # online steps come after trainer.max_steps: a schedule decayed to 0 there trained every one at lr 0
    (["dataset=inbox", "reward=ruler", "algorithm.lr_schedule=cosine"],
     r"algorithm.lr_schedule: is cosine, which decays to 0 at trainer.max_steps \(16\); dataset=inbox trains after"),
    (["backend.packed_sequence_length=0"], r"backend.packed_sequence_length: must be > 0 or null"),
    # "" read as off: paid rubric writing repeated every run (judge.cache_dir="" was refused for it already)
    (["reward=rubric", "reward.cache_dir="], r"reward.cache_dir: is empty: name a folder, or null"),
    # checked as judge.api_base is: a URL without its scheme failed only once the run had started
    (["backend=serverless", "storage.enabled=false", "backend.base_url=localhost:9"],
     r"backend.base_url: must be an http:// or https:// URL with a host"),
    # settings the SkyPilot task dropped without a word (found by an audit): the machines are the candidates', an
    # order needs two of them, and job recovery is a managed job's
    (["backend=skypilot", "judge=lexical", "model.weights=null", "backend.accelerators=A100:1",
      "+backend.candidates=[{accelerators: 'H100:1', infra: runpod}]"],
     r"backend.accelerators: is A100:1, but backend.candidates lists the machines .* put accelerators: A100:1 in a "
     r"candidate, or leave backend.accelerators out"),
    (["backend=skypilot", "judge=lexical", "model.weights=null", "backend.infra=lambda",
      "+backend.candidates=[{accelerators: 'H100:1', infra: runpod}]"], r"backend.infra: is lambda, but"),
    (["backend=skypilot", "judge=lexical", "model.weights=null", "backend.failover=ordered"],
     r"backend.failover: is ordered, but backend.candidates lists 0 machines: list two or more"),
    (["backend=skypilot", "judge=lexical", "model.weights=null", "backend.job_recovery.strategy=FAILOVER"],
     r"backend.job_recovery: is how SkyPilot recovers a managed job, and this job is not managed: add "
     r"backend.managed=true"),
    # W&B Training chooses its own adapter: a swept model.lora.r labelled identical runs as different (an audit)
    (["backend=serverless", "storage.enabled=false", "judge=lexical", "model.weights=null"],
     r"model.lora: backend=serverless can't apply r=16, alpha=32 \(ART 0.5.18's ServerlessBackend sends W&B only "
     r"model.base_model"),
    # boto3 refused them only at its first request: on a cluster after its paid setup, or as "can't reach S3"
    (["storage.endpoint_url=localhost:9000"],
     r"storage.endpoint_url: must be an http:// or https:// URL with a host, e.g. http://localhost:9000"),
    (["storage.bucket=s3://my-bucket"], r"storage.bucket is 's3://my-bucket' not a bucket name: give the bucket's "
                                        r"name alone, e.g. my-bucket \(a folder within it is storage.prefix\)"),
    (["storage.bucket=my-bucket/runs"], r"storage.bucket is 'my-bucket/runs' not a bucket name"),
    (["backend.json_max_string_chars=0"], r"backend.json_max_string_chars: must be > 0"),
    (["backend.device=cuda:abc"], r"backend.device: must be auto, cpu, cuda, cuda:N or mps"),
    (["dataset.files=[]"], r"dataset.files: is an empty list, which would read the hub instead"),
    (["project=a/b"], r"project: must be a non-empty name without '/', got 'a/b'"),
    (["run.name="], r"run.name: must be a non-empty name without '/', got ''"),
    (["trainer.wait_for_documents_s=-1"], r"trainer.wait_for_documents_s: must be >= 0"),
    # read only by dataset=inbox: elsewhere it was recorded in result.json and W&B as if it had counted
    (["trainer.min_new_documents=8"], r"trainer.min_new_documents: is 8, but only dataset=inbox reads it"),
    (["trainer.wait_for_documents_s=60"], r"trainer.wait_for_documents_s: is 60.0, but only dataset=inbox reads it"),
    # inf passed the `> 0` checks: an in-limit summary's length term is 0, and inf x 0 made every reward NaN
    (["reward=length_penalized", "reward.strength=inf"], r"reward.strength: must be a finite number, got inf"),
    (["reward=qa_rubric", "reward.terms.rubric.weight=nan"], r"reward.terms.rubric.weight: must be a finite number"),
    (["model.lr=inf"], r"model.lr: must be a finite number, got inf"),
    # every summary scored 0: the run trained nothing, its judge paid for
    (["reward=weighted", "reward.terms.qa.weight=0"],
     r"reward.terms.qa.weight: every term's weight is 0, so every summary scores 0 .* reward.terms.qa.weight=1.0"),
    (["reward=weighted", "reward.terms.qa.weight=0", "+reward.terms.len={kind: length, shape: hard}"],
     r"^reward.terms.qa.weight: every term's weight is 0"),
    # the hub's repliqa_0 has 3591 documents: this failed on the cluster, after it was rented and set up
    (["dataset=repliqa", "dataset.train_size=4000", "dataset.val_size=91"],
     r"dataset.train_size: ServiceNow/repliqa repliqa_0: train_size \+ val_size = 4000 \+ 91 documents, but only 3591"),
    (["sft=best_of_n", "sft.min_reward=0.5", "sft.top_k=3"],  # top_k was dropped without a word
     r"sft.top_k: is 3, but sft.min_reward=0.5 keeps every sample at or above it and top_k is not used"),
    (["sft=best_of_n", "sft.lr=inf"], r"sft.lr: must be a finite number, got inf"),
    # vLLM refused the adapter only when its runtime started, on a rented GPU (found by this stop's config audit)
    (["backend=local_gpu", "judge=lexical", "storage.enabled=false", "model.lora.r=32",
      "+backend.engine_args.max_lora_rank=16"], r"backend.engine_args.max_lora_rank: is 16, but vLLM serves only ranks "
                                                r"1, 8, .* model.lora.r=32: leave it out"),
    (["backend=local_gpu", "judge=lexical", "storage.enabled=false", "+model.engine_args.max_lora_rank=12"],
     r"model.engine_args.max_lora_rank: is 12"),
    # vLLM refused every rollout past its context only once the model had loaded on a (rented) GPU
    (["backend=local_gpu", "judge=lexical", "backend.max_model_len=512", "trainer.max_summary_tokens=1000"],
     r"backend.max_model_len: 512 tokens leave no room for the prompt beside trainer.max_summary_tokens \(1000\)"),
    (["backend=skypilot", "judge=lexical", "backend.local_gpu.max_seq_length=128"],
     r"backend.local_gpu.max_seq_length: 128 tokens leave no room"),
    # ART sets it itself and refused the other value as vLLM started, on the rented GPU
    (["backend=local_gpu", "judge=lexical", "+backend.engine_args.enable_sleep_mode=false"],
     r"backend.engine_args.enable_sleep_mode: is ART's to set"),
])
def test_values_that_would_waste_or_hang_a_run_are_refused_as_it_composes(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_config([*LOCAL, *overrides])


def test_a_kl_reference_checkpoint_not_yet_saved_is_refused_before_any_rollout(tmp_path, tiny_weights):
    """It failed at the first update (embedded), or inside ART's trainer without naming the setting (local_gpu)."""
    from summrl.loop import check_reference

    run = tmp_path / "run"  # the run itself: refused before the model loads
    result = run_cli([*LOCAL, tiny_weights, "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=3",
                      f"hydra.run.dir={run}"], cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "algorithm.kl_penalty_reference_step=3: this run's checkpoints end at step 0" in result.stderr
    assert "val reward" not in result.stdout and not list(run.rglob("*.parquet"))  # nothing sampled

    def check(step, *overrides):
        check_reference(compose_config([*LOCAL, "algorithm=grpo_kl", *overrides]), step)

    with pytest.raises(ConfigError, match=r"algorithm.kl_penalty_reference_step=3: this run's checkpoints end at "
                                          r"step 0 when GRPO starts"):
        check(0, "algorithm.kl_penalty_reference_step=3")
    with pytest.raises(ConfigError, match=r"end at step 1 when GRPO starts"):
        check(0, "sft=best_of_n", "algorithm.kl_penalty_reference_step=2")
    check(0, "sft=best_of_n", "algorithm.kl_penalty_reference_step=1")  # the SFT stage saves it first
    check(3, "algorithm.kl_penalty_reference_step=3")  # resumed: saved
    check(0, "algorithm.kl_penalty_reference_step=0")  # the base model
    check(0)


def test_the_limits_of_those_rules_still_compose():
    assert compose_config([*LOCAL, "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=16"])
    assert compose_config([*LOCAL, "algorithm=grpo_kl", "sft=best_of_n", "algorithm.kl_penalty_reference_step=17"])
    assert compose_config([*LOCAL, "algorithm.lr_schedule=linear", "algorithm.min_lr_ratio=0.1"])
    assert compose_config([*LOCAL, "trainer.val_temperature=0", "trainer.val_rollouts_per_doc=1"])
    assert compose_config([*LOCAL, "backend.device=cuda:1"]).backend.device == "cuda:1"


@pytest.mark.parametrize("overrides,message", [
    (["reward=weighted", "reward.terms.rubric.weight=0.2"],
     "reward.terms.rubric is not in the config (reward.terms holds qa), so it can't be overridden: add it with "
     "+reward.terms.rubric.weight=0.2"),
    (["reward=qa_rubric", "reward.terms.qa.include_unanswerabl=true"],
     "reward.terms.qa.include_unanswerabl is not a setting of QARewardConfig. Did you mean "
     "reward.terms.qa.include_unanswerable?"),
    # a term's own setting that its preset leaves out: Hydra's + adds it (it was "not a setting of
    # RubricRewardConfig. Did you mean reward.terms.rubric.cache_dir?", the very key given)
    (["reward=qa_rubric", "reward.terms.rubric.cache_dir=/data/rubrics"],
     "reward.terms.rubric.cache_dir is not in the config (reward.terms.rubric holds kind, weight), so it can't be "
     "overridden: add it with +reward.terms.rubric.cache_dir=/data/rubrics"),
])
def test_a_key_a_map_lacks_is_named_with_what_the_map_holds_and_how_to_add_it(overrides, message):
    """reward.terms is a map, typed only after Hydra composes it: a term it lacks needs Hydra's +, a term's unknown
    setting is named against the term's schema."""
    with pytest.raises(ConfigError) as raised:
        compose_config([*LOCAL, *overrides])
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("overrides,fix,keep", [
    # a map's new entry: Hydra's own suggestion, whole and quoted for the shell (it was cut at the first space)
    ([*LOCAL, "reward=weighted", "reward.terms={length: {kind: length, shape: hard}}"],
     ["+reward.terms={length: {kind: length, shape: hard}}"], False),
    ([*LOCAL, "reward=weighted", "~reward.terms.qa"],
     ["+reward.terms={qa: {kind: qa, weight: 1.0}, rubric: {kind: rubric, weight: 0.2}}"], True),
    # spot needs a managed job as well: the fix names both (it named use_spot alone, which failed next on managed)
    (["backend.spot_fallback=true"], ["backend.use_spot=true", "backend.managed=true"], True),
    # the remote job runs ART's GPU backend: without the gpu extra it failed on the cluster, after the paid setup
    (["backend.extras=dev"], ["backend.extras=gpu\\,dev"], False),
    # only the embedded engine reads model.weights: vLLM would have trained the hub's weights of model.base_model
    ([*LOCAL, "backend=local_gpu", "judge=lexical"], ["model.weights=null"], True),
    ([*LOCAL, "backend=skypilot", "judge=lexical"], ["model.weights=null"], True),
])
def test_the_fix_an_error_names_is_written_as_a_shell_takes_it_and_composes(overrides, fix, keep):
    """The message holds the fix as it is to be typed (``shlex.join``); typed, the config composes."""
    import shlex

    with pytest.raises(ConfigError) as raised:
        compose_config(overrides)
    assert shlex.join(fix) in str(raised.value)
    assert compose_config([*(overrides if keep else overrides[:-1]), *fix]) is not None


def test_backend_skypilots_remote_local_gpu_settings_are_named_where_they_are_written():
    """backend=skypilot's backend.local_gpu.* are checked as backend=local_gpu's backend.* are, and named as written."""
    with pytest.raises(ConfigError, match=r"^backend\.local_gpu\.gpu_memory_utilization: must be in \(0, 1\]"):
        compose_config(["backend.local_gpu.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match=r"^backend\.local_gpu\.engine_args\.max_model_len: has its own setting: use "
                                          r"backend\.local_gpu\.max_model_len$"):
        compose_config(["+backend.local_gpu.engine_args.max_model_len=4096"])
    assert compose_config(["backend.local_gpu.max_model_len=4096"]).backend.local_gpu.max_model_len == 4096
    with pytest.raises(ConfigError, match=r"^backend\.gpu_memory_utilization: must be in \(0, 1\]"):
        compose_config(["backend=local_gpu", "judge=lexical", "backend.gpu_memory_utilization=1.5"])


def test_validation_needs_no_heavy_imports():
    """Errors come before torch, ART or litellm load: the validation path does not import them."""
    code = (
        "import sys; from tests.conftest import compose_config\n"
        "try:\n    compose_config(['experiment=local', 'model.lr=abc'])\nexcept Exception as e: print(type(e).__name__)\n"
        "print(sorted(m for m in ('torch', 'art', 'litellm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["ConfigError", "[]"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["model.lr=abc"], "model.lr"),
        (["trainer.max_steps=-1"], "trainer.max_steps"),
        (["model=nope"], "Available options in 'model'"),
        (["trainer.max_stepz=3"], "trainer.max_stepz"),
        (["+trainer.max_stepz=3"], "Did you mean trainer.max_steps"),
        (["reward=qa_rubric", "reward.terms.rubric.weight=abc"], "reward.terms.rubric.weight: must be a number"),
    ],
)
def test_cli_fails_with_a_clear_message(args, message, tmp_path):
    result = run_cli(["experiment=local", f"hydra.run.dir={tmp_path}/run", *args], cwd=ROOT, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr + result.stdout
    assert not (tmp_path / "run" / "art").exists()  # nothing was loaded or trained


def test_dotenv_in_the_folder_a_command_runs_from_is_read_before_the_config_is_composed(tmp_path):
    """.env was loaded after the config was validated, and looked for beside summrl's own files only: ${oc.env:X} with
    X set in .env failed as unset, and a .env in the user's project folder (summrl installed elsewhere) was not read."""
    (tmp_path / ".env").write_text("SUMMRL_DOTENV_STEPS=-7\n")
    steps = "trainer.max_steps=${oc.env:SUMMRL_DOTENV_STEPS}"
    result = run_cli(["experiment=local", steps, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert "trainer.max_steps: must be > 0, got -7" in result.stderr  # the value .env holds, read and validated

    unset = run_cli(["experiment=local", "trainer.max_steps=${oc.env:SUMMRL_SET_NOWHERE}",
                     f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, timeout=60)
    assert unset.returncode == 2
    assert ("trainer.max_steps: reads ${oc.env:SUMMRL_SET_NOWHERE}, and SUMMRL_SET_NOWHERE is not set: export it or "
            "put it in .env") in unset.stderr


def test_a_missing_judge_key_fails_before_anything_loads(tmp_path):
    result = run_cli(["experiment=local", "judge=gemini_flash", "storage.enabled=true", f"hydra.run.dir={tmp_path}/run"],
                     cwd=ROOT, timeout=60, env={"GEMINI_API_KEY": "", "BACKUP_BUCKET": ""})
    assert result.returncode == 3  # a preflight error (README: "When a run fails")
    # every missing item at once, each with its fix
    assert "the judge's key is not set: export GEMINI_API_KEY or put it in .env" in result.stderr
    assert "storage.enabled=true needs a bucket: set BACKUP_BUCKET" in result.stderr
    assert not (tmp_path / "run" / "art").exists()
    # a bucket from the environment that is a URL: named by its variable (it travels as a secret), not echoed
    result = run_cli(["experiment=local", "storage.enabled=true", f"hydra.run.dir={tmp_path}/run2"], cwd=ROOT,
                     timeout=60, env={"BACKUP_BUCKET": "s3://planted-bucket"})
    assert result.returncode == 3
    assert "$BACKUP_BUCKET is not a bucket name: give the bucket's name alone" in result.stderr
    assert "planted-bucket" not in result.stderr + result.stdout


@pytest.mark.parametrize("judge,model,key", [
    ("gemini_flash", "gemini/gemini-2.5-flash", "GEMINI_API_KEY"),
    ("gemini_flash_openrouter", "openrouter/google/gemini-2.5-flash", "OPENROUTER_API_KEY"),
])
def test_hosted_judges_name_their_key_variable_not_the_key(judge, model, key):
    config = compose_config([*LOCAL, f"judge={judge}"])
    assert (config.judge.model, config.judge.api_key_env) == (model, key)


@pytest.mark.parametrize("module,override,schema", [("summrl.train", "judge.no_such_key=1", "LocalJudgeConfig"),
                                                    ("summrl.benchmark", "benchmark.no_such_key=1", "BenchmarkSection")])
def test_an_unknown_key_fails_while_hydra_composes_naming_its_full_path(module, override, schema, tmp_path):
    """Hydra's structured configs refuse the key while composing; summrl.cli words it as one config-error line."""
    result = subprocess.run([sys.executable, "-m", module, "experiment=local", override, f"hydra.run.dir={tmp_path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    key = override.split("=")[0]
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0].startswith(f"summrl: config error: {key} is not a setting of {schema}.")
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())  # nothing ran


def test_a_run_folder_set_through_run_dir_is_refused_naming_hydra_run_dir(tmp_path):
    """run.dir is where the run's checkpoints go, but Hydra writes its config (.hydra/, which serve, export and
    resume read) into its own output folder: a run split over two folders could not be served."""
    elsewhere = tmp_path / "elsewhere"
    result = subprocess.run([sys.executable, "-m", "summrl.train", "experiment=local", f"run.dir={elsewhere}",
                             f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == (f"summrl: config error: run.dir={elsewhere}: the run folder is Hydra's "
                                             f"output folder; set hydra.run.dir={elsewhere} instead (run.dir follows "
                                             "it; hydra.sweep.dir for a multirun)")
    assert not elsewhere.exists() and "config error" in (tmp_path / "hydra" / "result.json").read_text()


def test_every_schema_is_in_hydras_config_store_and_option_files_hold_only_what_differs():
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    import summrl.benchmark.config  # noqa: F401  (it registers benchmark_schema, as summrl.benchmark does)
    from summrl.config import KIND_SCHEMAS, AlgorithmConfig, ModelConfig, SFTConfig

    repo = ConfigStore.instance().repo
    assert {"train_schema.yaml", "benchmark_schema.yaml"} <= set(repo)
    for group, schemas in KIND_SCHEMAS.items():
        assert {f"base_{kind}.yaml" for kind in schemas} <= set(repo[group])
    fixed = {"model": ModelConfig, "algorithm": AlgorithmConfig, "sft": SFTConfig}

    def repeated(node, default, path):
        for key, value in node.items():
            if isinstance(value, dict) and isinstance(default.get(key), dict):
                yield from repeated(value, default[key], f"{path}.{key}")
            elif key in default and value == default[key] and key != "name":
                yield f"{path}.{key}"

    for group in [*KIND_SCHEMAS, *fixed]:
        for path in sorted((CONF / group).glob("*.yaml")):
            option = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            parents = option.pop("defaults", [])
            schema = fixed.get(group) or KIND_SCHEMAS[group][parents[0].removeprefix("base_")]
            default = OmegaConf.to_container(OmegaConf.structured(schema), resolve=False)
            for parent in (p for p in parents if p != "_self_" and not p.startswith("base_")):  # a preset extending one
                default.update({k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONF / group / f"{parent}.yaml")).items()
                                if k != "defaults"})
            assert not list(repeated(option, default, group)), f"{path.name} repeats its schema's defaults"


@pytest.mark.parametrize("model,accelerators,message", [
    ("qwen2_5_7b", "A100:1", "backend.accelerators: A100:1 is too small for model=qwen2_5_7b: it needs 80 GB per GPU, "
                             "A100 has 40 GB"),
    ("qwen2_5_14b", "H100:1", "backend.accelerators: H100:1 is too small for model=qwen2_5_14b: it trains on 2 GPUs"),
    ("qwen2_5_3b", "L4:1", "backend.accelerators: L4:1 is too small for model=qwen2_5_3b: it needs 40 GB per GPU"),
    # SkyPilot takes any case: "l4" was not found in the table and launched (found by an audit)
    ("qwen2_5_3b", "l4:1", "backend.accelerators: l4:1 is too small for model=qwen2_5_3b: it needs 40 GB per GPU"),
    ("qwen3_8b", "L40S:1", "backend.accelerators: L40S:1 is too small for model=qwen3_8b: it needs 80 GB per GPU"),
])
def test_a_model_on_a_gpu_too_small_for_it_is_refused_naming_both(model, accelerators, message):
    with pytest.raises(ConfigError, match=message):
        compose_config(["judge=lexical", f"model={model}", f"backend.accelerators={accelerators}"])
    with pytest.raises(ConfigError, match=message.replace("backend.accelerators", r"backend.candidates.1.accelerators")):
        compose_config(["judge=lexical", f"model={model}", "backend.failover=ordered",
                        f'backend.candidates=[{{accelerators: "H200:2"}}, {{infra: runpod, accelerators: "{accelerators}"}}]'])


def test_bigger_presets_fit_their_gpus_and_the_14b_runs_in_arts_dedicated_mode():
    from summrl.backends import internal_config

    for model, accelerators in (("qwen2_5_7b", "H100:1"), ("qwen2_5_14b", "H100-SXM:2"), ("qwen2_5_14b", "A100-80GB:2")):
        config = compose_config(["judge=lexical", f"model={model}", f"backend.accelerators={accelerators}"])
        assert config.model.step_minutes > 0
    remote = compose_config(["judge=lexical", "model=qwen2_5_14b", "backend=local_gpu",
                             "+backend.engine_args.max_num_seqs=32"])
    internal = internal_config(remote)
    assert (internal["trainer_gpu_ids"], internal["inference_gpu_ids"]) == ([0], [1])  # training GPU 0, vLLM GPU 1
    assert internal["engine_args"]["max_num_seqs"] == 32  # the backend's own engine args win over the preset's
    assert internal["engine_args"]["gpu_memory_utilization"] == 0.8
    assert "trainer_gpu_ids" not in internal_config(compose_config(["judge=lexical", "model=qwen2_5_7b",
                                                                    "backend=local_gpu"]))
    assert "chat_template_kwargs" not in internal_config(compose_config(["judge=lexical", "model=qwen2_5_7b",
                                                                         "backend=local_gpu"]))


def test_the_qwen3_preset_turns_thinking_off_for_rollouts_and_training_alike():
    from summrl.backends import internal_config

    config = compose_config(["judge=lexical", "model=qwen3_8b", "backend.accelerators=H100:1"])
    assert config.model.step_minutes > 0
    local = compose_config(["judge=lexical", "model=qwen3_8b", "backend=local_gpu"])
    # ART 0.5.18 sends these as vLLM's chat_template_kwargs with every rollout and tokenizes training with them
    assert internal_config(local)["chat_template_kwargs"] == {"enable_thinking": False}
    with pytest.raises(ConfigError, match="model.engine_args.gpu_memory_utilization: is the backend's to set"):
        compose_config([*LOCAL, "+model.engine_args.gpu_memory_utilization=0.5"])


@pytest.mark.parametrize("module,key,path", [("summrl.train", "hydra.run.dir", "file"),
                                             ("summrl.train", "hydra.run.dir", "file/run"),
                                             ("summrl.train", "hydra.sweep.dir", "file"),
                                             ("summrl.benchmark", "hydra.run.dir", "file/run")])
def test_an_output_folder_where_a_file_stands_is_one_config_error_not_mkdirs_traceback(module, key, path, tmp_path):
    """Hydra makes the output folder before the job starts; a file in the way was mkdir's FileExistsError or
    NotADirectoryError traceback (exit 1)."""
    (tmp_path / "file").write_text("a file the user keeps\n")
    sweep = ["-m", "seed=1,2"] if key == "hydra.sweep.dir" else []
    result = subprocess.run([sys.executable, "-m", module, *sweep, "experiment=local", f"{key}={tmp_path / path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    where = "it" if path == "file" else f"{tmp_path / 'file'} (in its path)"
    assert result.stderr.splitlines() == [f"summrl: config error: {key}={tmp_path / path}: {where} is a file, not a "
                                          "folder: name another folder, or move the file"]
    assert (tmp_path / "file").read_text() == "a file the user keeps\n"


def readme_train_commands() -> list[str]:
    """Every `python -m summrl.train ...` the README shows a user to run: in its code blocks and inline. Lines shown
    failing on purpose (``$ `` examples under "Bad input") and forms with a placeholder for overrides are left out."""
    import re

    text = (ROOT / "README.md").read_text()
    lines = [line for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M) for line in block.splitlines()]
    lines += re.findall(r"`(python -m summrl\.train[^`]*)`", text)
    commands = []
    for line in lines:
        found = re.search(r"python -m summrl\.train(?=\s|$)(.*)", line)
        if not found or line.lstrip().startswith("$") or "..." in line or "<your overrides>" in line:
            continue
        command = found.group(1).split("#")[0].strip()
        if not command.startswith("--"):  # --cfg job, --help: Hydra's own flags
            commands.append(command)
    return sorted(set(commands))


def one_job_per_value(overrides: list[str]) -> list[list[str]]:
    """A ``-m`` command's jobs: the product of its comma-separated values (no brackets among the sweeps here)."""
    import itertools

    values = [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")] if "," in o and "[" not in o
              else [o] for o in overrides]
    return [list(job) for job in itertools.product(*values)]


@pytest.mark.parametrize("command", readme_train_commands())
def test_every_training_command_the_readme_shows_composes_and_validates(command, tmp_path):
    import shlex

    args = [a.replace("<name>", "x").replace("<user>", "me") for a in shlex.split(command)]
    jobs = one_job_per_value([a for a in args if a != "-m"]) if "-m" in args else [args]
    for job in jobs:
        if any(a.startswith("dataset.path=") for a in job):
            job = [a for a in job if not a.startswith("dataset.path=")] + ["dataset.path=tests/fixtures/documents"]
        assert compose_config([*job, f"run.dir={tmp_path}"]) is not None


def test_the_readme_shows_training_commands_for_every_kind_of_run():
    commands = readme_train_commands()
    assert len(commands) >= 15
    assert any(c.startswith("-m") for c in commands) and any("sft=distill" in c for c in commands)


# ----------------------------------------------------------------------------- no secret in a config

PLANTED = "QSECRET-9f3a"  # a credential no message, log or file may show


@pytest.mark.parametrize("override,key,fix", [
    (f"judge.api_base='https://llm.example.com/v1?key={PLANTED}'", "judge.api_base", "judge.api_key_env"),
    (f"judge.api_base='https://user:{PLANTED}@llm.example.com/v1'", "judge.api_base", "judge.api_key_env"),
    ("judge.api_base='https://llm.example.com/v1?key=${oc.env:SUMMRL_PLANTED}'", "judge.api_base", "judge.api_key_env"),
    (f"storage.endpoint_url='http://ak:{PLANTED}@localhost:9000'", "storage.endpoint_url", "AWS_SECRET_ACCESS_KEY"),
    (f"judge.api_key_env={PLANTED}", "judge.api_key_env", "export MY_KEY=<the key> and set judge.api_key_env=MY_KEY"),
    # keys that are also valid variable names: Gemini's, Hugging Face's, a long mixed-case one (saved and echoed)
    ("judge.api_key_env=AIzaSyPLANTED0123456789abcdefghijklmno", "judge.api_key_env", "set judge.api_key_env=MY_KEY"),
    ("sft.teacher.api_key_env=hf_PLANTEDabcdefghijklmnopqrstu", "sft.teacher.api_key_env", "MY_KEY=<the key>"),
    ("judge.api_key_env=x9PLANTEDk2Lm4Nq7Rs8Tu0Vw3Xy5Za6Bc1De", "judge.api_key_env", "MY_KEY=<the key>"),
    # a setting named for a secret, with the secret itself (Unsloth takes token=): it reached result.json, the W&B
    # run name and config (the "." before token was no word boundary to the mask)
    (f"+model.init_args.token={PLANTED}", "model.init_args.token", "${oc.env:THE_VARIABLE}"),
    # resolved to the key itself, which a variable name outside the mask's pattern left in result.json and W&B
    ("judge.api_key_env=${oc.env:SUMMRL_PLANTED}", "judge.api_key_env", "not an interpolation: set judge.api_key_env=MY_KEY"),
    # a key typed into the cluster's setup command: saved, logged and printed in the SkyPilot task
    (["backend=skypilot", "backend.setup='huggingface-cli login --token hf_PLANTEDabcdefghijklmnopqrstu'"], "backend.setup",
     "write its variable instead ($HF_TOKEN)"),
    # a Gemini key with a "-" (split into pieces no pattern matched), and a hex key given to its variable
    (["backend=skypilot", "backend.setup='export GEMINI_API_KEY=AIzaSyD8-xK2mN4pQ7rS9tU1vW3yZ5aB6cE8fGh'"],
     "backend.setup", "write its variable instead"),
    (["backend=skypilot", "backend.setup='WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567 wandb login'"],
     "backend.setup", "write its variable instead"),
    # a benchmark model entry names its key with api_key_env (the fix said HF_TOKEN)
    # settings with no api_key_env of their own: the fix named model.api_key_env, which does not exist
    (f"model.weights='https://example.org/m.gguf?token={PLANTED}'", "model.weights", "that the tool reads itself"),
    # query names outside a list of whole names: saved in .hydra/, result.json, W&B and the rubric cache (an audit)
    (f"judge.api_base='https://llm.example.com/v1?api_token={PLANTED}'", "judge.api_base", "judge.api_key_env"),
    (f"judge.api_base='https://llm.example.com/v1?x-api-key={PLANTED}'", "judge.api_base", "judge.api_key_env"),
    (f"model.weights='https://b.s3.amazonaws.com/m.gguf?X-Amz-Security-Token={PLANTED}&X-Amz-Signature=ab'",
     "model.weights", "that the tool reads itself"),
    # keys shaped like variable names: Groq's, and a hex key (taken as names, and echoed in "export gsk_...")
    ("judge.api_key_env=gsk_PLANTEDk3Jd8sLq0ZxW2vN7bT5yR1mQ4pA6cE9hU0iO3gF8", "judge.api_key_env", "MY_KEY=<the key>"),
    ("judge.api_key_env=d41d8cd98f00b204e9800998ecf8427ed41d8cd9", "judge.api_key_env", "MY_KEY=<the key>"),
])
def test_a_secret_in_the_config_is_refused_naming_the_key_and_where_a_key_goes_never_the_secret(override, key, fix,
                                                                                             monkeypatch):
    """Hydra saves the config into the run folder as typed, and it is logged and sent to W&B: a credential in a URL,
    or a key typed into an ``*_env`` setting (which holds a variable's name), is refused."""
    monkeypatch.setenv("SUMMRL_PLANTED", PLANTED)
    with pytest.raises(ConfigError) as refused:
        compose_config([*LOCAL, "judge=openai_compatible", *([override] if isinstance(override, str) else override)])
    assert str(refused.value).startswith(f"{key}: ") and fix in str(refused.value)
    assert PLANTED not in str(refused.value) and "PLANTED" not in str(refused.value)


def test_ordinary_setup_commands_pass_the_typed_key_check():
    for command in ("pip install flash-attn==2.6.3 --no-build-isolation", "huggingface-cli login --token $HF_TOKEN",
                    "pip install git+https://github.com/x/y@3f2a9c1d0e4b5a6978877665544332211aabbccd",
                    "export TOKENIZERS_PARALLELISM=false HF_HUB_ENABLE_HF_TRANSFER=1",
                    "echo sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"):
        config = compose_config([*LOCAL, "judge=lexical", "backend=skypilot", "model.weights=null",
                                 f"backend.setup='{command}'"])
        assert config.backend.setup == command


def test_urls_without_credentials_and_variable_names_pass_and_the_named_variables_are_masked(monkeypatch):
    from summrl.secrets import redact_text

    monkeypatch.setenv("JUDGE_KEY", PLANTED)  # a name the usual pattern (API_KEY, TOKEN, ...) does not catch
    config = compose_config([*LOCAL, "judge=openai_compatible", "judge.api_base='http://127.0.0.1:8000/v1?model=x'",
                             "judge.api_key_env=JUDGE_KEY", "storage.endpoint_url=http://localhost:9000"])
    assert config.judge.api_key_env == "JUDGE_KEY"
    long_name = "Azure_OpenAI_Api_Key_For_Prod_Env2"  # mixed case, digits, 34 characters: a name, by its "_"s
    assert compose_config([*LOCAL, "judge=openai_compatible", f"judge.api_key_env={long_name}"]).judge.api_key_env == (
        long_name)
    assert redact_text(f"the judge said {PLANTED}") == "the judge said ***"  # named by judge.api_key_env: masked
    # a credential that reaches a message another way (a library's error) is masked too
    assert redact_text(f"at https://u:{PLANTED}@h/v1 and https://h/v1?a=1&key={PLANTED}", []) == (
        "at https://***@h/v1 and https://h/v1?a=1&key=***")


def test_a_sweeps_overrides_are_read_for_credentials_in_urls_only():
    """A multirun's overrides, read before its jobs compose them: deletions, quoted names and plain URLs pass."""
    from omegaconf import OmegaConf

    from summrl.config import refuse_secrets

    refuse_secrets(OmegaConf.create({}), ["~judge.api_key_env", "judge.api_key_env='MY_KEY'", "sft.teacher.api_key_env=",
                                          "judge.api_base=http://a:8000/v1,'https://b/v1?model=x'",
                                          "+model.init_args.token=${oc.env:HF_TOKEN}", "trainer.max_summary_tokens=64"])
    with pytest.raises(ConfigError, match=r"^model\.init_args\.token: a secret typed into the config"):
        refuse_secrets(OmegaConf.create({}), [f"+model.init_args.token={PLANTED}"])
    with pytest.raises(ConfigError) as unknown:  # without the +: the fix it offers does not echo the value
        compose_config([*LOCAL, f"model.init_args.token={PLANTED}"])
    assert str(unknown.value).endswith("add it with +model.init_args.token=<value>") and PLANTED not in str(unknown.value)
    with pytest.raises(ConfigError, match=r"^sft\.teacher\.api_base: the URL carries a credential in its query \(sig=\)"):
        refuse_secrets(OmegaConf.create({}), [f"sft.teacher.api_base=http://a/v1,'https://b/v1?sig={PLANTED}'"])


def test_the_cli_refuses_a_secret_before_hydra_writes_the_run_or_sweep_folder(tmp_path):
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    single = run_cli([*LOCAL, "judge=openai_compatible", f"judge.api_base='https://llm.example.com/v1?key={PLANTED}'",
                      f"hydra.run.dir={run}"], cwd=ROOT, timeout=120)
    # a multirun's swept values are composed per job, after Hydra has made the sweep folder: its overrides are read
    swept = run_cli(["-m", *LOCAL, "judge=openai_compatible",
                     f"judge.api_base=http://127.0.0.1:1/v1,'https://u:{PLANTED}@llm.example.com/v1'",
                     f"hydra.sweep.dir={sweep}"], cwd=ROOT, timeout=120)
    for result in (single, swept):
        assert result.returncode == 2, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("summrl: config error: judge.api_base: the URL carries")
        assert PLANTED not in result.stdout + result.stderr
    # Hydra's own overrides: a job's environment set on the command line was saved in .hydra/hydra.yaml (an audit);
    # here with no override of the task's (an empty list, which Hydra's callback once turned into a warning)
    env_set = run_cli([f"+hydra.job.env_set.WANDB_API_KEY={PLANTED}", f"hydra.run.dir={run}"], cwd=ROOT, timeout=120)
    assert env_set.returncode == 2 and env_set.stderr.strip().splitlines() == [
        "summrl: config error: hydra.job.env_set.WANDB_API_KEY: a secret typed here is saved with the run "
        "(.hydra/hydra.yaml): export WANDB_API_KEY in your shell (or put it in .env) instead; the job inherits the "
        "environment"]
    # a variable the judge's key is read from, whatever its name (it passed: no KEY/TOKEN in the name of the setting)
    named = run_cli([*LOCAL, "judge=openai_compatible", "judge.api_key_env=MY_JUDGE",
                     f"+hydra.job.env_set.MY_JUDGE={PLANTED}", f"hydra.run.dir={run}"], cwd=ROOT, timeout=120)
    assert named.returncode == 2 and named.stderr.strip().splitlines()[-1].startswith(
        "summrl: config error: hydra.job.env_set.MY_JUDGE: a secret typed here is saved with the run")
    assert PLANTED not in named.stdout + named.stderr
    assert not run.exists() and not sweep.exists()


def test_an_override_that_reads_a_variable_is_recorded_as_typed_never_resolved(tmp_path, monkeypatch):
    """Hydra's overrides, read item by item, resolve ${oc.env:...}: the variable's value went into result.json's
    overrides (and W&B's, and a skypilot job's remote command) under a name the mask does not know."""
    monkeypatch.setenv("SUMMRL_PLANTED", PLANTED)  # no API_KEY/TOKEN/SECRET in its name: not masked by its name
    run = tmp_path / "run"
    result = run_cli([*LOCAL, "+model.init_args.note=${oc.env:SUMMRL_PLANTED}", "trainer.max_steps=0",
                      f"hydra.run.dir={run}"], cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "trainer.max_steps" in result.stderr  # refused after the job's record opened
    record = (run / "result.json").read_text()
    assert PLANTED not in record + result.stdout + result.stderr
    assert "+model.init_args.note=${oc.env:SUMMRL_PLANTED}" in json.loads(record)["overrides"]


def test_a_length_penalized_rewards_own_keys_reach_the_w_and_b_config_beside_its_terms():
    """Validation turns reward=length_penalized into a weighted sum; a sweep over reward.strength is still found
    under reward.strength."""
    from summrl.job import JobInfo
    from summrl.tracking import flat_config

    config = compose_config([*LOCAL, "reward=length_penalized", "reward.strength=0.5", "reward.shape=quadratic"])
    flat = flat_config(config, JobInfo(overrides=["reward=length_penalized", "reward.strength=0.5"]))
    assert (flat["reward.base"], flat["reward.shape"], flat["reward.strength"]) == ("qa", "quadratic", 0.5)
    assert flat["reward.kind"] == "weighted" and flat["reward.terms.length.weight"] == 0.5
    # an empty mapping is a value: it left no key, so a run that set engine_args and one that did not differed by a
    # missing key (an options audit)
    assert (flat["model.engine_args"], flat["model.init_args"], flat["model.chat_template_kwargs"]) == ({}, {}, {})


def test_a_judge_or_teacher_model_litellm_cant_route_is_refused_before_anything_loads(monkeypatch):
    from summrl.preflight import problems

    monkeypatch.setenv("GEMINI_API_KEY", "x")
    config = compose_config(["experiment=local", "judge=gemini_flash", "judge.model=gemini-2.5-flsh",
                             "sft=distill", "sft.teacher.model=gemini-2.5-pr", "storage.enabled=false"])
    found = problems(config)
    assert [p.split(":")[0] for p in found if "can't tell which provider" in p] == [
        "judge.model=gemini-2.5-flsh", "sft.teacher.model=gemini-2.5-pr"]
    spelled = compose_config(["experiment=local", "judge=gemini_flash", "sft=distill", "storage.enabled=false",
                              "sft.teacher.model=openai/teacher", "sft.teacher.api_base=http://127.0.0.1:9/v1"])
    assert not [p for p in problems(spelled) if "provider" in p]



def test_a_hosted_judge_with_no_key_variable_named_needs_litellms_and_takes_it_to_the_cluster(monkeypatch):
    """judge.api_key_env=null with no api_base: litellm reads its provider's variable (ANTHROPIC_API_KEY). Nothing
    checked it: the model loaded and every val reward failed (AuthenticationError); nor was it sent to the cluster."""
    from summrl.cloud.launch import secrets
    from summrl.preflight import problems

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    model = "anthropic/claude-3-5-haiku-20241022"
    config = compose_config(["experiment=local", "judge=openai_compatible", f"judge.model={model}",
                             "judge.api_base=null", "storage.enabled=false"])
    assert f"judge.model={model} needs ANTHROPIC_API_KEY (litellm's variable for its provider): export it or put it " \
           "in .env, or name another with judge.api_key_env" in problems(config)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-planted")
    assert not [p for p in problems(config) if "needs" in p]
    assert secrets(config)["ANTHROPIC_API_KEY"] == "sk-ant-planted"



def test_an_embedded_device_this_machine_lacks_is_refused_before_anything_loads(monkeypatch):
    """backend.device=cuda (or mps) on a machine without it ended in torch's traceback, after every import."""
    import torch

    from summrl.preflight import problems

    def on(device: str) -> list[str]:
        return [p for p in problems(compose_config(["experiment=local", f"backend.device={device}"])) if "device" in p]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert on("cuda")[0].startswith("backend.device=cuda: torch sees no CUDA GPU here")
    assert on("cuda")[0].endswith("use backend.device=auto (the GPU when there is one) or cpu")
    assert on("mps") == ["backend.device=mps: torch sees no Apple GPU (MPS) here: use backend.device=auto (the GPU "
                         "when there is one) or cpu"]
    assert on("auto") == on("cpu") == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert on("cuda:1") == [] and on("cuda") == []
    assert on("cuda:2")[0].startswith("backend.device=cuda:2: torch sees 2 CUDA GPU(s), cuda:0 to cuda:1")


def test_model_weights_that_are_not_there_are_refused_before_anything_loads(tmp_path):
    """A missing model.weights (or a LoRA module the model lacks) was a traceback after every import, exit 1."""
    from summrl.backends.embedded.engine import load_causal_lm
    from summrl.errors import ConfigError
    from summrl.preflight import problems

    gone = tmp_path / "model.gguf"
    assert f"model.weights={gone}: {gone} does not exist: point it at a model folder or .gguf file" in problems(
        compose_config(["experiment=local", f"model.weights={gone}"]))
    assert "model.weights: pkg:no_such_package/m.gguf: the package 'no_such_package' is not installed" in " ".join(
        problems(compose_config(["experiment=local", "model.weights=pkg:no_such_package/m.gguf"])))
    with pytest.raises(ConfigError, match="does not exist: point it at a model folder"):
        load_causal_lm("HuggingFaceTB/SmolLM2-135M-Instruct", str(gone), None, None)  # export, benchmark, serve


def test_a_lora_module_the_model_lacks_is_a_config_error_naming_its_layers(tiny_weights):
    from summrl.backends.embedded.engine import Engine
    from summrl.config import LoraConfig
    from summrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model.lora.target_modules=\['foo'\]: .*foo.*; this model's linear layers "
                                          r"are down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj$"):
        Engine(base_model="tiny", weights=tiny_weights.split("=", 1)[1], lora=LoraConfig(target_modules=["foo"]))


@pytest.mark.parametrize("entry", ["train", "benchmark"])
def test_cfg_job_resolve_prints_the_config_with_its_keys_masked(entry, tmp_path):
    """Hydra's `--cfg job --resolve` ended in a config error: the run folder (Hydra's output folder) is not made
    then, and its typed setting refused null. Printed, an ${oc.env:...} of a key is masked, as in every log."""
    import os

    override = ("judge.api_base=http://127.0.0.1:9/${oc.env:GEMINI_API_KEY}" if entry == "train"
                else "benchmark.name=n${oc.env:GEMINI_API_KEY}")
    flags = ["--cfg", "job", "--resolve"] if entry == "train" else ["--cfg=job", "--resolve"]  # argparse's two forms
    result = subprocess.run([sys.executable, "-m", f"summrl.{entry}", override, *flags],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "GEMINI_API_KEY": "planted-gemini-cfg-7c1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "planted-gemini-cfg-7c1" not in result.stdout + result.stderr
    shown = {"train": ("  dir: null", "api_base: http://127.0.0.1:9/***"),
             "benchmark": ("  output_dir: null", "name: n***")}[entry]
    assert all(line in result.stdout for line in shown), result.stdout
    if entry == "train":  # argparse's other spellings printed the key unmasked (found by this stop's config audit)
        for spelled in (["-cjob", "--resolve"], ["--cf", "job", "--resolve"]):
            other = subprocess.run([sys.executable, "-m", "summrl.train", override, *spelled], cwd=ROOT,
                                   capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "GEMINI_API_KEY": "planted-gemini-cfg-7c1"})
            assert other.returncode == 0 and shown[1] in other.stdout, other.stderr[-2000:]
            assert "planted-gemini-cfg-7c1" not in other.stdout + other.stderr
    # null set by hand in a run: refused naming the setting to use, not a TypeError's traceback later
    null = {"train": ["experiment=local", "run.dir=null"], "benchmark": ["benchmark.output_dir=null", "benchmark.models=[]"]}
    refused = subprocess.run([sys.executable, "-m", f"summrl.{entry}", *null[entry], f"hydra.run.dir={tmp_path}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1].startswith(
        {"train": "summrl: config error: run.dir=null: the run folder is Hydra's output folder; set hydra.run.dir=<folder>",
         "benchmark": "summrl: config error: benchmark.output_dir: null; it is Hydra's output folder"}[entry])


def test_a_run_name_set_in_a_preset_names_a_sweeps_jobs():
    """A multirun named its jobs for the sweep folder unless run.name was on the command line: a preset's own
    run.name (an experiment's YAML) was replaced without a word (found by this stop's config audit)."""
    from omegaconf import OmegaConf

    from summrl.config import compose
    from summrl.train import _named

    assert not _named(compose("train", ["experiment=local", "run.dir=x"]))  # conf/train.yaml's ${now:...}
    assert _named(compose("train", ["experiment=local", "run.dir=x", "run.name=mine"]))
    assert _named(OmegaConf.create({"run": {"name": "myablation"}}))  # as a preset's YAML sets it
