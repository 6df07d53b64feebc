"""backend=skypilot: run this same job on a cloud GPU that SkyPilot provisions, with backend=local_gpu there.

ART removed its SkyPilotBackend in 0.5.9; its documented pattern is to let SkyPilot provision the machine
and run the training program there on ART's LocalBackend. So the task's workdir is this repo (minus what
``.skyignore`` lists: ``.env``, run outputs, environments), its setup installs the project with the
``[gpu]`` extra, and its run is ``python -m summrl.train <this job's overrides> run.name=<name>
backend=local_gpu``. API keys and AWS credentials travel as SkyPilot *secrets* (redacted in SkyPilot's
logs and dashboards), never as envs, never in a file summrl writes. SkyPilot itself keeps the launch request (its
API server's state under ``~/.sky``) and, for a managed job, the task's YAML on its jobs controller, secrets in clear.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

from summrl import splits
from summrl.config import FREE_JUDGES, rewards_of_kind
from summrl.data import DataError
from summrl.errors import (KINDS, NETWORK_FIX, ConfigError, ExpectedFailure, NetworkError, classify, full_errors,
                           is_network, network_message)
from summrl.cloud import managed, plan, pricing
from summrl.job import RunRecord, task_overrides, write_result
from summrl.judges import missing_keys
from summrl.keys import key_names
from summrl.preflight import PreflightError, teacher_key_names, teacher_key_problems, unknown_provider
from summrl.secrets import MIN_SECRET, redact_text, secret_values
from summrl.storage import bucket_problems, fetch_result, resolve_bucket
from summrl.tracking import wandb_mode

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent.parent

# Forwarded to the cluster as secrets when set here (environment or .env).
SECRET_NAMES = (
    "GEMINI_API_KEY", "OPENROUTER_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY", "OPENPIPE_API_KEY", "HF_TOKEN",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION",
    "BACKUP_BUCKET",
)
# Settings (not secrets) the remote job reads from its environment: forwarded as plain envs when set here.
FORWARDED_ENVS = ("WANDB_MODE",)
# Overrides of this launcher that must not reach the remote job (it gets its own backend and name).
_LOCAL_ONLY = ("backend", "run.name", "run.dir")
# dataset=documents: the remote job's question cache, where the questions written here (summrl.data prepare) are
# copied with the task, so that no cluster writes (and pays for) them again.
REMOTE_QUESTIONS = "~/.cache/summrl/questions"
# reward=rubric (or a rubric term) with an LLM judge: the remote job's rubric cache, where the rubrics this machine's
# cache holds for the run's judge (written by summrl.data prepare, or by earlier runs) are copied with the task.
REMOTE_RUBRICS = "~/.cache/summrl/rubrics"


class RemoteJobFailed(ExpectedFailure, RuntimeError):
    """The remote job ended unsuccessfully. ``exit_code`` is SkyPilot's job exit code (100 failed, 103 cancelled).
    ``managed``: a managed job (``cluster`` is then its name). Expected: a sweep records the failed job, with its
    one line and exit code, and goes on."""

    failure = "remote"

    def __init__(self, exit_code: int, cluster: str, job_id: Optional[int], managed: bool = False) -> None:
        if managed:
            text = (f"the managed job {job_id} ({cluster}) ended with exit code {exit_code}: "
                    f"see its logs with `sky jobs logs {job_id}`")
        else:
            text = (f"the job {job_id} on cluster {cluster} ended with exit code {exit_code}: "
                    f"see its logs with `python -m summrl.cluster logs {cluster}`")
        super().__init__(text)
        self.exit_code = exit_code
        self.cluster = cluster
        self.job_id = job_id


# --------------------------------------------------------------------------- preflight


def preflight(config: Any, questions: Optional[QuestionCache] = None) -> list[str]:
    """Everything the launch needs that is missing, each with its fix. Offline, in well under a second (more when
    dataset=documents has a document long enough to need the policy's tokenizer, which training needs as well).
    ``questions``: dataset=documents' question cache, when the caller has read it already."""
    problems = []
    try:
        import sky  # noqa: F401
    except ImportError:
        problems.append("skypilot is not installed: pip install -e '.[cloud]'")
    # the infras the job may land on: the candidates', which replace backend.infra (no infra: any enabled one)
    b = config.backend
    infras = {(c.infra or "any").split("/")[0].lower() for c in b.candidates} or {b.infra.split("/")[0].lower()}
    if "runpod" in infras:
        problem = runpod_credentials_problem()
        if problem:
            problems.append(problem)
    problems += loopback_problems(config)
    for name in missing_keys(config.judge):
        problems.append(f"{name} (the judge's key) is not set: export it or put it in .env")
    problems += teacher_key_problems(config)
    # a model id litellm can't place fails the remote job's own preflight, after the GPU is provisioned and billed
    if config.judge.kind == "litellm":
        problems += unknown_provider(config.judge, "judge")
    if config.sft.kind == "distill":
        problems += unknown_provider(config.sft.teacher, "sft.teacher")
    if config.dataset.kind == "documents":
        path = Path(config.dataset.path).expanduser().resolve()
        if not path.is_relative_to(ROOT):
            problems.append(f"dataset.path={config.dataset.path} is outside the project folder {ROOT}, the only folder "
                            "SkyPilot copies to the cluster: move (or copy) the documents into it")
        elif left_out := skyignored(path):
            problems.append(f"dataset.path={config.dataset.path} is in {left_out}, which .skyignore leaves out of "
                            "what SkyPilot copies to the cluster (run outputs, environments, caches): move (or copy) "
                            "the documents into another folder of the project")
        problems += questions_problems(config, questions or QuestionCache(config))
    online = getattr(config.logger, "kind", "none") == "wandb" and wandb_mode(config.logger) == "online"
    if online and not os.environ.get("WANDB_API_KEY"):
        problems.append("WANDB_API_KEY (logger=wandb, online) is not set: export it or put it in .env, "
                        "or run offline with WANDB_MODE=offline")
    if config.storage.enabled:
        if not resolve_bucket(config.storage):
            problems.append("no bucket for the S3 backups: set BACKUP_BUCKET in .env (or storage.bucket=<name>); the "
                            "run's checkpoints and result.json come back from the cluster only through them")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            if not os.environ.get(name):
                problems.append(f"{name} (S3 backups from the cluster) is not set: export it or put it in .env")
        problems += bucket_problems(config.storage)
    return problems


def skyignored(path: Path) -> Optional[str]:
    """The project's folder or file, as SkyPilot's own reading of .skyignore excludes it from the uploaded workdir,
    that holds ``path`` (a path inside the project); None: it is uploaded, or SkyPilot is not installed."""
    try:
        from sky.data.storage_utils import get_excluded_files
    except ImportError:
        return None
    relative = path.relative_to(ROOT)
    for excluded in get_excluded_files(str(ROOT)):
        left_out = Path(excluded.rstrip("/"))
        if relative == left_out or left_out in relative.parents:
            return f"{left_out}/" if (ROOT / left_out).is_dir() else str(left_out)
    return None


def no_backup_warning(config: Any) -> Optional[str]:
    """storage.enabled=false on a cluster: the run stays on a machine RunPod deletes once idle."""
    if config.storage.enabled:
        return None
    return ("storage.enabled=false: the run's checkpoints and result.json stay on the cluster, and only there; it is "
            f"taken down {config.backend.idle_minutes_to_autostop} idle minutes after the job "
            "(backend.idle_minutes_to_autostop), or at its end with backend.down_after_run=true, and they go with it. "
            "Copy the run folder off before (SkyPilot adds the cluster to your ssh config: rsync -a <cluster>:sky_workdir/"
            "<run folder> .), or back it up to S3 (storage.enabled=true with BACKUP_BUCKET)")


LOOPBACK = re.compile(r"^(localhost|127(\.\d+){3}|0\.0\.0\.0|::1?)$", re.IGNORECASE)


def on_this_machine_only(host: str) -> bool:
    """``host`` names this machine's loopback: a cluster that connects there reaches itself."""
    return LOOPBACK.match(host) is not None


def loopback_problems(config: Any) -> list[str]:
    """A judge, teacher or S3 endpoint on this machine: the cluster would reach itself there, and fail after its paid
    provisioning and setup (S3 at the bucket check, before any model loads; the others at the first call)."""
    from urllib.parse import urlsplit

    endpoints = [("judge.api_base", getattr(config.judge, "api_base", None)),
                 ("sft.teacher.api_base", getattr(getattr(config.sft, "teacher", None), "api_base", None))]
    if config.storage.enabled:
        endpoints.append(("storage.endpoint_url", config.storage.endpoint_url))
    problems = []
    for key, url in endpoints:
        try:
            host = urlsplit(url).hostname if url else None
        except ValueError:
            host = None
        if host and on_this_machine_only(host):
            problems.append(f"{key}={url} is on this machine (loopback): the cluster can't reach it; give an address "
                            "the cluster can reach (a public host name, or a tunnel's)")
    return problems


class QuestionCache:
    """dataset=documents: the files of this machine's question cache that the run reads, and how many documents have
    none yet, or why the documents could not be read. The preflight and the task's file mounts both need them, and
    each reading goes through every document: a launch reads them once (:func:`run_on_cluster`)."""

    def __init__(self, config: Any, report: bool = True) -> None:
        self.files: list[Path] = []
        self.pending, self.error = 0, None
        try:  # a bad file fails here, not after the cluster has started
            self.files, self.pending = splits.cached_question_files(config, report=report)
        except DataError as e:
            self.error = str(e)


def questions_problems(config: Any, questions: QuestionCache) -> list[str]:
    """dataset=documents: a bad file, and questions left for a paid judge to write where nobody can confirm the cost.
    The remote job has no terminal, so with dataset.questions.confirm on, every question must be written here first;
    those written here travel with the task (:func:`question_mounts`)."""
    if questions.error is not None:
        return [questions.error]
    q, pending = config.dataset.questions, questions.pending
    if not pending or not q.confirm or config.judge.kind in FREE_JUDGES:
        return []
    return [f"dataset.questions: {pending} documents have no questions yet, and the remote job has no terminal to "
            f"confirm the judge's cost in: write them here first, with `python -m summrl.data prepare` and this run's "
            f"overrides (it asks here; what it writes goes with the job, so no cluster pays again), or add "
            f"dataset.questions.confirm=false (with dataset.questions.max_cost_usd=<$> as a budget; the estimate is "
            f"printed in the job's log)"]


def question_mounts(config: Any, questions: QuestionCache) -> dict[str, str]:
    """dataset=documents: the run's questions in this machine's cache, copied into ``<run dir>/questions`` (what was
    sent, kept with the run) and mounted as the remote job's question cache. Empty when none are cached (or the
    documents are bad: the preflight lists them, and nothing is launched)."""
    if not questions.files:
        return {}
    return {REMOTE_QUESTIONS: str(staged_copy(questions.files, Path(config.run.dir) / "questions"))}


def rubric_mounts(config: Any) -> dict[str, str]:
    """Rubric terms with an LLM judge: the rubrics this machine's cache holds for the run's judge (and each term's
    max_rubrics), copied into ``<run dir>/rubrics`` and mounted as the remote job's rubric cache. Empty when none."""
    from summrl.rewards import rubric  # the judges' modules: only where a launch needs them

    files = rubric.cached_files(config)
    if not files:
        return {}
    return {REMOTE_RUBRICS: str(staged_copy(files, Path(config.run.dir) / "rubrics"))}


def staged_copy(files: list[Path], staged: Path) -> Path:
    """``files`` copied into ``staged`` (emptied first): what the task uploads, and what the run keeps of it."""
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    # Without a .skyignore here SkyPilot would read the project's .gitignore, which ignores runs/ (and git fails on
    # an ignored folder): this one excludes nothing.
    (staged / ".skyignore").write_text("# summrl: every file here is a cache entry the remote job reads\n")
    for file in files:
        shutil.copy2(file, staged / file.name)
    return staged


def runpod_credentials_problem() -> Optional[str]:
    """SkyPilot 0.14 (`sky check runpod`) reads the key from ~/.runpod/config.toml, [default] api_key."""
    path = Path.home() / ".runpod" / "config.toml"
    fix = ("runpod config (the runpod CLI comes with the [cloud] extra; paste the API key from "
           "https://www.runpod.io/console/user/settings), "
           "then sky check runpod")
    if not path.exists():
        return f"RunPod credentials: {path} does not exist: {fix}"
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, OSError):
        return f"RunPod credentials: {path} is not valid TOML: {fix}"
    if not isinstance(data.get("default"), dict) or not data["default"].get("api_key"):
        return f"RunPod credentials: {path} has no api_key in its [default] profile: {fix}"
    return None


def secrets(config: Any) -> dict[str, str]:
    """The values the remote job needs, from this environment (after .env is loaded)."""
    names = list(SECRET_NAMES)
    if config.judge.kind == "litellm":  # its api_key_env, or litellm's variable for a hosted judge's provider
        names += key_names(config.judge)
    elif getattr(config.judge, "api_key_env", None):
        names.append(config.judge.api_key_env)
    names += teacher_key_names(config)  # sft=distill: its api_key_env, or litellm's variable for a hosted teacher
    return {name: os.environ[name] for name in dict.fromkeys(names) if os.environ.get(name)}


def referenced_variables(overrides: list[str]) -> dict[str, str]:
    """The variables the job's overrides read (``+model.init_args.token=${oc.env:MY_TOKEN}``, kept as typed), set
    here: the remote job resolves them from its own environment, so they travel with the secrets."""
    names = re.findall(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)", " ".join(overrides))
    return {name: os.environ[name] for name in dict.fromkeys(names) if os.environ.get(name)}


# --------------------------------------------------------------------------- the task


def cluster_name(config: Any, job_num: Optional[int]) -> str:
    """A multirun's jobs each drive their own cluster, so that they run in parallel (hydra/launcher=joblib)."""
    base = config.backend.cluster_name
    return base if job_num is None else f"{base}-{job_num}"


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0].strip()


def _value(v: Any) -> str:
    """``v`` in Hydra's override grammar. (JSON is not: a mapping's quoted keys, and a comma in a string, stopped
    the remote job at its first line, after the paid setup.)"""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    text = str(v)
    if re.fullmatch(r"[\w/][\w./:@+-]*", text) and text.lower() not in ("true", "false", "null", "nan", "inf"):
        try:
            float(text)  # "1e5" unquoted would come back a number
        except ValueError:
            return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_parses(args: list[str]) -> None:
    """Every override of the remote command as Hydra will read it on the cluster: refused here, before any money."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for arg in args:
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as e:
            raise ConfigError(f"the cloud job's override {redact_text(arg)!r} is not valid Hydra syntax "
                              f"({str(e).splitlines()[0][:120]}): quote its value") from None


def _quoted(path: str) -> str:
    """A path as a quoted string of Hydra's override grammar, where ``~``, a space or a parenthesis would not parse
    unquoted (the remote job would stop at its first line)."""
    return "'" + path.replace("'", "\\'") + "'"


def backend_args(config: Any) -> list[str]:
    """The remote job's backend=local_gpu settings, resolved here (a ``${oc.env:...}`` in them is its value)."""
    gpu = config.backend.local_gpu
    backend = [f"backend.{f.name}={_value(getattr(gpu, f.name))}" for f in fields(gpu)
               if f.name not in ("kind", "engine_args") and getattr(gpu, f.name) is not None]
    # ++: engine_args is an empty mapping in local_gpu.yaml, and struct mode refuses new keys without it.
    return backend + [f"++backend.engine_args.{k}={_value(v)}" for k, v in gpu.engine_args.items()]


def remote_command(config: Any, overrides: list[str]) -> str:
    """``python -m summrl.train`` with this job's own overrides, its run name and backend=local_gpu."""
    kept = [o for o in overrides
            if not any(_override_key(o) == k or _override_key(o).startswith(k + ".") for k in _LOCAL_ONLY)]
    backend = backend_args(config)
    # Values the local environment chose (TRAIN_SIZE / VAL_SIZE) are pinned, so the remote job is this job.
    keys = {_override_key(o) for o in kept}
    pinned = [f"dataset.{k}={getattr(config.dataset, k)}" for k in ("train_size", "val_size")
              if f"dataset.{k}" not in keys]
    if config.dataset.kind == "documents":  # the cluster has the project folder (the workdir), at another path
        kept = [o for o in kept if _override_key(o) not in ("dataset.path", "dataset.questions.cache_dir")]
        relative = Path(config.dataset.path).expanduser().resolve().relative_to(ROOT).as_posix()
        pinned.append(f"dataset.path={_quoted(relative)}")
        pinned.append(f"dataset.questions.cache_dir={_quoted(REMOTE_QUESTIONS)}")
    # where the task puts what rubric_mounts carries
    for key, reward in rewards_of_kind(config.reward, "rubric").items():
        if reward.cache_dir is not None:
            kept = [o for o in kept if _override_key(o) != f"{key}.cache_dir"]
            pinned.append(f"++{key}.cache_dir={_quoted(REMOTE_RUBRICS)}")  # ++: a term's preset may not list it
    # hydra.mode=RUN: a preset that sweeps (experiment=reward_ablation sets hydra.mode: MULTIRUN) made the job a
    # sweep of one, which renamed the run, so its status, backup and result were looked for under the wrong name
    args = [*kept, *pinned, f"run.name={_value(config.run.name)}", "backend=local_gpu", *backend, "hydra.mode=RUN"]
    check_parses(args)
    return "python -m summrl.train " + " ".join(shlex.quote(a) for a in args)


def setup_script(config: Any) -> str:
    extras = config.backend.extras.strip()
    target = f".[{extras}]" if extras else "."
    lines = [
        "set -euo pipefail",
        # ART needs Python >= 3.11; uv brings it whatever the image ships. .venv is skyignored, so it persists.
        "command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh",
        'export PATH="$HOME/.local/bin:$PATH"',
        "[ -x .venv/bin/python ] || uv venv --python 3.11 .venv",
        f"uv pip install --python .venv/bin/python -e {shlex.quote(target)}",
        # ART installs its vLLM runtime (its own uv venv) on first use: here, once per cluster (extras has gpu)
        ".venv/bin/python -c 'from art.vllm_runtime import ensure_vllm_runtime; ensure_vllm_runtime()'",
    ]
    if config.backend.setup:
        lines.append(config.backend.setup)
    return "\n".join(lines)


def run_script(config: Any, overrides: list[str]) -> str:
    return "\n".join([
        "set -euo pipefail",
        'export PATH="$HOME/.local/bin:$PATH"',
        ". .venv/bin/activate",
        remote_command(config, overrides),
    ])


def build_task(config: Any, overrides: list[str], cluster: str, resources: bool = True,
               questions: Optional[QuestionCache] = None) -> Any:
    """The SkyPilot task for this job. Secrets go in the task's secrets mapping only.
    Its resources need SkyPilot's catalog (fetched online once): ``resources=False`` leaves them out.
    ``questions``: dataset=documents' question cache, when the caller has read it already."""
    import sky

    b = config.backend
    setup, run = setup_script(config), run_script(config, overrides)
    referenced = referenced_variables(overrides)
    forwarded = {**secrets(config), **referenced}
    check_no_secret(referenced, {"backend.setup": (setup, setup),
                                 "the cloud job's command (backend.* settings)": (run, " ".join(backend_args(config)))})
    task = sky.Task(name=cluster, setup=setup, run=run, workdir=str(ROOT))
    task.update_secrets(forwarded)
    task.update_envs({name: os.environ[name] for name in FORWARDED_ENVS if os.environ.get(name)})
    mounts = rubric_mounts(config)
    if config.dataset.kind == "documents":
        mounts.update(question_mounts(config, questions or QuestionCache(config, report=False)))
    if mounts:
        task.set_file_mounts(mounts)
    if resources:
        task.set_resources(sky.Resources.from_yaml_config(resources_spec(b)))
    return task


def check_no_secret(referenced: dict[str, str], scripts: dict[str, tuple[str, str]]) -> None:
    """No secret's value in the task's commands: a ``${oc.env:HF_TOKEN}`` in ``backend.setup`` or an engine arg is
    resolved here, and SkyPilot keeps commands in clear (the task YAML, a managed job's controller, this log).
    ``scripts``: each command, and its part resolved from the config (the setup; the backend.* arguments).
    ``referenced``: the variables the overrides read, whatever their names (``${oc.env:MY_HF}``), which the task
    forwards as secrets too: their values are looked for as whole words in the resolved parts only (a run name or
    a W&B project read from the environment is meant to be in the command, and "summrl" is in summrl.train)."""
    values = set(secret_values())  # variables named as secrets (not BACKUP_BUCKET or AWS_REGION, which are settings)
    named = {name: value for name, value in os.environ.items() if value in values}
    for where, (text, resolved) in scripts.items():
        found = [name for name, value in named.items() if value in text]  # secret_values: MIN_SECRET or longer
        found += [name for name, value in referenced.items() if len(value) >= MIN_SECRET and name not in named
                  and re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w.-])", resolved)]
        if found:
            name = found[0]
            raise ConfigError(
                f"{where} holds the value of {name}: SkyPilot would keep it in clear in the task. {name} reaches "
                f"the cluster as a secret: in backend.setup write ${name} (the cluster's environment has it) "
                f"instead of ${{oc.env:{name}}}, and leave it out of backend.engine_args (vLLM and Hugging Face "
                "read HF_TOKEN from the environment)")


def resources_spec(b: Any) -> dict:
    """The task's ``resources`` as a SkyPilot YAML mapping: one machine, or the candidates as ``any_of`` (cheapest
    first) or ``ordered``; spot with its on-demand fallback; a managed job's ``job_recovery``."""
    spec: dict[str, Any] = {"disk_size": b.disk_size}
    if b.managed:
        r = b.job_recovery
        spec["job_recovery"] = {"strategy": r.strategy, "max_restarts_on_errors": r.max_restarts_on_errors,
                                **({"recover_on_exit_codes": list(r.recover_on_exit_codes)}
                                   if r.recover_on_exit_codes else {})}
    machines = [{"infra": c.infra, "accelerators": c.accelerators, "use_spot": b.use_spot if c.use_spot is None
                 else c.use_spot} for c in b.candidates] or [{"infra": b.infra, "accelerators": b.accelerators,
                                                              "use_spot": b.use_spot}]
    machines = [{k: v for k, v in m.items() if v is not None} for m in machines]  # no infra: any enabled one
    if b.spot_fallback:  # after every spot choice, the same machine on demand
        machines += [{**m, "use_spot": False} for m in machines if m["use_spot"]]
    if len(machines) == 1:
        return {**spec, **machines[0]}
    return {**spec, ("ordered" if b.failover == "ordered" else "any_of"): machines}


@contextlib.contextmanager
def quiet_sky():
    """SkyPilot's status spinners (``<sky-payload>`` lines outside its CLI) and its catalog logs: our own
    messages say what failed."""
    from sky import sky_logging

    with sky_logging.silent(), sky_logging.set_sky_logging_levels(logging.CRITICAL):
        yield


def describe(task: Any, resources: Optional[dict] = None) -> str:
    """The task as YAML with every secret's value replaced by <redacted> (never SkyPilot's clear-text dump).
    ``resources``: as asked for, when the task could not hold them (no catalog)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: Any, value: str) -> Any:  # scripts as literal blocks, as a task YAML would hold them
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    # use_user_specified_yaml on a task built in Python: SkyPilot's own redacted rendering.
    spec = task.to_yaml_config(use_user_specified_yaml=True)
    if resources:
        spec["resources"] = resources
    spec = {k: v for k, v in spec.items() if v != {}}  # SkyPilot's empty file_mounts and volumes
    return redact_text(yaml.dump(spec, Dumper=Dumper, sort_keys=False, width=10**6))


# --------------------------------------------------------------------------- the lifecycle


def run_from_hydra(config: Any, record: Optional[RunRecord] = None) -> Optional[float]:
    """run_on_cluster for the current Hydra job: its task overrides, and its number in a multirun.
    A single run exits with the remote job's exit code."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    job_num = hydra_cfg.job.num if hydra_cfg.mode == RunMode.MULTIRUN else None
    try:
        return run_on_cluster(config, task_overrides(hydra_cfg), job_num, record)
    except RemoteJobFailed as e:
        if job_num is not None:
            raise  # a sweep records the failed job and goes on
        if record is not None:  # as a sweep's job is recorded: a managed run's record said "submitted" for good
            line = f"{KINDS[e.failure][1]}: {e}"
            record.update(status="failed", error=line)
            record.fail(e.failure, line, e.exit_code)
        log.error(f"summrl: {e}")
        sys.exit(e.exit_code)  # a single run exits as the remote job did
    except PreflightError as e:
        if job_num != 0 or full_errors():
            raise
        # The sweep's first job: the keys, the credentials and the budget are every job's, so its listing would
        # repeat for each of them (and again as Hydra's summary). The sweep stops here, with nothing submitted.
        failure = classify(e)
        if record is not None:
            record.fail(failure.kind, f"{KINDS[failure.kind][1]}: {failure.message}", failure.exit_code)
        log.error(f"{failure.line}\nsummrl: the sweep stopped at its first job: nothing was submitted")
        sys.exit(failure.exit_code)


def job_name(config: Any) -> str:
    """A managed job's name: the cluster name and the run's (a multirun's jobs each have their own run name)."""
    return f"{config.backend.cluster_name}-{config.run.name}"


def run_on_cluster(config: Any, overrides: list[str], job_num: Optional[int] = None,
                   record: Optional[RunRecord] = None) -> Optional[float]:
    """Preflight, then launch (or reuse) the cluster, stream the job's logs, and end as the remote job did.
    Returns the remote run's final val score when its result.json is in the S3 backup (else None).

    Raises PreflightError before anything is provisioned, and RemoteJobFailed when the job fails.
    """
    b = config.backend
    cluster = job_name(config) if b.managed else cluster_name(config, job_num)  # the task's name
    logging.getLogger("alembic").setLevel(logging.WARNING)  # SkyPilot's state DB migrations, at Hydra's INFO
    questions = QuestionCache(config) if config.dataset.kind == "documents" else None
    problems = preflight(config, questions)
    if warning := no_backup_warning(config):
        log.warning(f"summrl: warning: {warning}")
    if importlib.util.find_spec("sky") is None:  # nothing more can be checked without it
        raise PreflightError(_listing(b, problems))
    unreachable = None  # SkyPilot's catalog, when there is no network
    with quiet_sky():
        try:
            task = build_task(config, overrides, cluster, questions=questions)
        except Exception as e:
            if not is_network(e):
                raise
            unreachable, task = e, build_task(config, overrides, cluster, resources=False, questions=questions)
    if carried := (task.file_mounts or {}).get(REMOTE_RUBRICS):
        log.info(f"summrl: rubrics: {len(list(Path(carried).glob('*.json')))} written here for this judge go with the "
                 "job; any other document's are written on the cluster (`python -m summrl.data prepare` with this "
                 "run's overrides writes them here, once for every job)")
    asked = resources_spec(b) if unreachable else None
    with quiet_sky():
        estimates = plan.estimates(config, overrides, job_num)
    if b.dry_run:
        where = f"{b.accelerators} on {b.infra}" if not b.candidates else f"{len(b.candidates)} candidate machines"
        what = f"managed job {cluster}" if b.managed else f"cluster {cluster}"
        log.info(f"summrl: dry run: {what}, {where}\n{describe(task, asked)}")
    log.info(pricing.describe(estimates[job_num or 0], config))
    if job_num in (None, 0) and len(estimates) > 1:
        log.info(f"summrl: estimated cost of the sweep of {len(estimates)} jobs: {pricing.usd(pricing.total(estimates))}")
    if problem := pricing.budget_problem(estimates, b.max_cost_usd):
        problems.append(problem)
    with quiet_sky():
        try:
            task.validate()  # workdir, resources, run: before any money is spent
            if unreachable is None:
                problems += offered_problems(task, b)
        except Exception as e:
            if not is_network(e):
                raise
            unreachable = e
    if unreachable is not None:
        note = (f"SkyPilot's catalog could not be reached, so backend.accelerators={b.accelerators} on {b.infra} "
                f"was not checked ({network_message(unreachable)}; {NETWORK_FIX})")
        if problems:
            raise PreflightError(_listing(b, [*problems, note]))
        if b.dry_run:
            if job_num not in (None, 0):  # said in full by the sweep's first job
                note = (f"backend.accelerators={b.accelerators} on {b.infra} was not checked (SkyPilot's catalog is "
                        "out of reach, as above)")
            log.info(f"summrl: dry run: {note}; nothing was launched")
            return None
        raise NetworkError(note)
    if problems:
        raise PreflightError(_listing(b, problems))
    if b.dry_run:
        log.info("summrl: dry run: the task is valid; nothing was launched")
        return None

    if b.managed:
        submitted = managed.submit(config, task, cluster, estimates[job_num or 0], record)
        if job_num is not None:  # a sweep submits every job and returns: summrl.sweep follows them
            return None
        code = managed.follow(cluster, submitted["id"])
        if code is None:
            return None
        if code != 0:
            raise RemoteJobFailed(code, cluster, submitted["id"], managed=True)
        return remote_result(config, {"managed_job": submitted})

    import sky

    log.info(f"summrl: launching run {config.run.name} on cluster {cluster} ({b.accelerators} on {b.infra}); "
             f"reused if it is up, taken down after {b.idle_minutes_to_autostop} idle minutes")
    request = job_id = None
    try:
        request = sky.launch(task, cluster_name=cluster, idle_minutes_to_autostop=b.idle_minutes_to_autostop,
                             down=True)
        job_id = sky.stream_and_get(request)[0]
        code = sky.tail_logs(cluster, job_id, follow=True)
    except KeyboardInterrupt:
        if job_id is not None:
            sky.get(sky.cancel(cluster, job_ids=[job_id]))
            log.error(f"\nsummrl: cancelled job {job_id} on {cluster}.")
            log.error(f"summrl: the cluster {cluster} stays up until {b.idle_minutes_to_autostop} idle minutes pass. "
                      f"Take it down now: python -m summrl.cluster down {cluster}  (or: sky down {cluster})")
        elif request is not None:  # still provisioning: SkyPilot's API server would carry on without us
            sky.get(sky.api_cancel(request, silent=True))
            # SkyPilot sets autostop once the machine is provisioned and synced: a cluster this launch created may
            # have none yet, and bill until it is taken down
            log.error(f"\nsummrl: cancelled the launch of {cluster}, before SkyPilot set its autostop: if the "
                      f"launch had created it, it stays up and bills until you take it down: python -m summrl.cluster "
                      f"down {cluster}  (or: sky down {cluster}; `sky status` lists it)")
        raise
    if b.down_after_run:
        log.info(f"summrl: taking cluster {cluster} down (backend.down_after_run=true)")
        sky.stream_and_get(sky.down(cluster))
    else:
        log.info(f"summrl: cluster {cluster} stays up for the next run and goes down after "
                 f"{b.idle_minutes_to_autostop} idle minutes; now: python -m summrl.cluster down {cluster}")
    if code != 0:
        raise RemoteJobFailed(int(code), cluster, job_id)
    return remote_result(config)


def remote_result(config: Any, keep: Optional[dict] = None) -> Optional[float]:
    """The remote run's final val score, for sweepers: its result.json, backed up to S3, copied to the local run dir
    (with ``keep``: a managed job's submission record, which summrl.sweep reads)."""
    try:
        result = fetch_result(config)
    except Exception as e:  # the run itself succeeded; only the summary is out of reach (the bucket stays unnamed)
        log.warning(f"summrl: warning: can't read the run's result.json from the S3 backup ({type(e).__name__})")
        return None
    if result is None:
        return None
    write_result(config.run.dir, {**result, **(keep or {})})  # the remote job's record, as its RunRecord wrote it
    log.info(f"summrl: run {config.run.name} {result.get('status')}: final val reward {result.get('final_val_score')}")
    return result.get("final_val_score")


def offered_problems(task: Any, b: Any) -> list[str]:
    """The accelerators must exist on the infra: SkyPilot's catalog says so offline (at launch it would be late)."""
    problems = []

    def offered(r: Any) -> bool:
        return bool(r.cloud.get_feasible_launchable_resources(r, num_nodes=task.num_nodes).resources_list)

    for r in task.resources:
        if r.cloud is None or str(r.cloud).lower() in ("kubernetes", "ssh", "slurm"):
            continue  # no catalog (or any cloud): the cluster, or SkyPilot's optimizer at launch, says what it has
        if offered(r):
            continue
        if r.use_spot and b.spot_fallback and offered(r.copy(use_spot=False)):  # its fallback is in the task too
            wanted = ",".join(f"{k}:{v}" for k, v in (r.accelerators or {}).items())
            log.warning(f"summrl: warning: {str(r.cloud).lower()} has no spot {wanted} (SkyPilot's catalog): "
                        "backend.spot_fallback=true launches it on demand")
            continue
        if not b.candidates:
            problems.append(f"backend.accelerators={b.accelerators} is not offered on {b.infra} (SkyPilot's catalog): "
                            f"see `sky show-gpus --infra {b.infra}`, e.g. backend.accelerators=H100-SXM:1")
        else:
            wanted = ",".join(f"{k}:{v}" for k, v in (r.accelerators or {}).items())
            infra = str(r.cloud).lower()
            problems.append(f"backend.candidates: {wanted}{' (spot)' if r.use_spot else ''} is not offered on {infra} "
                            f"(SkyPilot's catalog): see `sky show-gpus --infra {infra}`, or drop that candidate")
    return problems


def _listing(b: Any, problems: list[str]) -> str:
    return f"can't launch on {b.infra} yet:\n" + "\n".join(f"  - {p}" for p in problems)
