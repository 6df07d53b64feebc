"""``python -m summrl.export run_dir=runs/<name> [step=best|latest|<N>]``: a trained checkpoint as files anyone loads.

Writes into ``export.dir`` (default ``<run_dir>/export/step-<N>/``):

- ``adapter/``: the checkpoint's PEFT LoRA adapter (not ART's optimizer state) and the tokenizer;
- ``merged/``: the base model with the adapter merged (peft's ``merge_and_unload``), in safetensors, which
  ``transformers.AutoModelForCausalLM.from_pretrained`` loads; a GGUF base is de-quantized to ``export.dtype``;
- ``README.md``: a model card (Hugging Face front matter) with the run's config, val scores and the command;
- ``export.json``: what was exported from where, and how.

``export.push_to_hub=<user>/<name>`` then uploads the folder with ``huggingface_hub``. A bad run folder or step, an
existing folder that is not an export, or a push without a Hugging Face token ends with one line and exit code 2
before any model loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shlex
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from summrl import __version__, cli
from summrl.checkpoints import TrainedRun, best_axis, resolve_step, run_config, trained_run
from summrl.config import _require, typed_entry
from summrl.errors import ConfigError, ExpectedFailure, exit_on, first_line
from summrl.job import comparable, task_overrides
from summrl.secrets import redact, redact_text

log = logging.getLogger("summrl.export")  # not __main__ under python -m: summrl's console handlers

DTYPES = ("float32", "bfloat16", "float16")
ADAPTER_FILES = ("adapter_model.safetensors",)  # adapter_config.json is rewritten; optimizer.pt stays behind
# Licenses of the shipped base models (conf/model/), for the card's front matter; another base model gets none.
LICENSES: dict[str, dict[str, str]] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": {"license": "apache-2.0"},
    "Qwen/Qwen2.5-3B-Instruct": {"license": "other", "license_name": "qwen-research",
                                 "license_link": "https://huggingface.co/Qwen/Qwen2.5-3B-Instruct/blob/main/LICENSE"},
    **{name: {"license": "apache-2.0", "license_link": f"https://huggingface.co/{name}/blob/main/LICENSE"}
       for name in ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen3-8B")},
}


@dataclass
class ExportSection:
    dir: Optional[str] = None  # null: <run_dir>/export/step-<N>/; an earlier export there is replaced
    # The merged model's saved dtype: float32 | bfloat16 | float16. null: the run's backend.dtype (embedded), else
    # bfloat16 (the GPU backends train and serve in it). The merge itself is done in float32, on the CPU.
    dtype: Optional[str] = None
    push_to_hub: Optional[str] = None  # a Hub repo id (<user or org>/<name>): upload the folder once written
    private: bool = True  # a repo that push_to_hub creates is private; an existing repo keeps its visibility

    def __post_init__(self) -> None:
        _require(self.dtype is None or self.dtype in DTYPES, "export.dtype",
                 f"must be one of {', '.join(DTYPES)} or null (the run's dtype), got {self.dtype!r}")


@dataclass
class ExportSchema:
    """conf/export.yaml (``export_schema`` in Hydra's ConfigStore)."""

    run_dir: str = MISSING  # a training run folder, runs/<run.name>
    step: str = "best"  # best (the best val score in result.json) | latest | <N>
    export: ExportSection = field(default_factory=ExportSection)


ConfigStore.instance().store(name="export_schema", node=ExportSchema)


@dataclass
class ExportConfig:
    run: TrainedRun
    step: int
    chosen: str  # why this step: best | latest | asked
    train: Any  # the run's summrl.config.Config
    dir: Path
    dtype: str
    push_to_hub: Optional[str]
    private: bool


def validate_export(cfg: DictConfig) -> ExportConfig:
    """Type conf/export.yaml, read the run, resolve the step and check the destination and the Hub token: every
    failure a user can fix, before any model loads. Raises ConfigError (one line)."""
    schema: ExportSchema = typed_entry(cfg, ExportSchema)
    run = trained_run(schema.run_dir, "run_dir")
    step = resolve_step(run, schema.step, "step")
    text = str(schema.step).strip().lower()
    if step == 0:  # best can be the base model, when training did not beat it
        raise ConfigError(f"step={schema.step}: step 0 is the base model{' (it scored best)' if text == 'best' else ''}; "
                          f"there is no adapter to export: name a trained step (step=latest or one of "
                          f"{', '.join(map(str, run.steps)) or 'none'})")
    train = run_config(run)
    section = schema.export
    dtype = section.dtype or (train.backend.dtype if train.backend.kind == "embedded" else "bfloat16")
    target = Path(section.dir).expanduser() if section.dir else run.run_dir / "export" / f"step-{step}"
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / "export.json").is_file())):
        raise ConfigError(f"export.dir: {target} exists and is not an earlier export (no export.json); choose a new or "
                          "empty folder")
    if extra := not_exported(target):
        raise ConfigError(f"export.dir: {target} holds {len(extra)} file(s) the earlier export did not write "
                          f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}): an export replaces the whole "
                          "folder, so they would be deleted; move them out, or choose a new folder")
    if section.push_to_hub is not None:
        check_hub(section.push_to_hub)
    check_checkpoint_files(run.checkpoint(step), step)
    return ExportConfig(run=run, step=step, chosen=text if text in ("best", "latest") else "asked", train=train,
                        dir=target, dtype=dtype, push_to_hub=section.push_to_hub, private=section.private)


def not_exported(target: Path) -> list[str]:
    """The files in an earlier export's folder that its export.json does not list: a GGUF converted from merged/, a
    clone's .git. The export replaced the whole folder, and deleted them."""
    if not (target / "export.json").is_file():
        return []
    try:
        listed = set(json.loads((target / "export.json").read_text()).get("files") or {})
    except (OSError, ValueError, AttributeError):  # an export.json cut short or edited: nothing is known to be ours
        listed = set()
    held = {p.relative_to(target).as_posix() for p in target.rglob("*") if not p.is_dir()}
    return sorted(held - listed - {"export.json"})


def check_checkpoint_files(checkpoint: Path, step: int) -> None:
    """The checkpoint's adapter files read, before any model loads (a traceback and exit 1 otherwise)."""
    from safetensors import safe_open

    try:
        json.loads((checkpoint / "adapter_config.json").read_text())
        with safe_open(str(checkpoint / "adapter_model.safetensors"), framework="pt") as f:
            f.keys()
    except Exception as e:  # OSError, JSONDecodeError, safetensors' own error
        raise ConfigError(f"step={step}: its checkpoint ({checkpoint}) can't be read ({type(e).__name__}: "
                          f"{first_line(e)}): export another step") from None


def check_hub(repo_id: str) -> None:
    """The repo id's form and a token (HF_TOKEN, or a cached ``hf auth login``), checked offline."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
        if "/" not in repo_id:
            raise HFValidationError("it has no namespace")
    except HFValidationError as e:
        raise ConfigError(f"export.push_to_hub={repo_id}: not a Hub repo id ({str(e).splitlines()[0]}); use "
                          "<user or org>/<name>") from None
    if not get_token():
        raise ConfigError(f"export.push_to_hub={repo_id}: no Hugging Face token; export HF_TOKEN=<a write token> or "
                          "run `hf auth login`, or leave export.push_to_hub unset to export locally only")
    if constants.HF_HUB_OFFLINE:  # read once at import, from HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE)
        raise ConfigError(f"export.push_to_hub={repo_id}: HF_HUB_OFFLINE is set, so the Hub can't be reached (the push "
                          "ended in a traceback after the whole export); unset it to push, or leave "
                          "export.push_to_hub unset to export locally only")


class PushFailed(ExpectedFailure):
    """The Hub refused the upload (a token without write access, a repo of someone else): the export is kept."""


# --------------------------------------------------------------------------- the export


def export(config: ExportConfig, command: str) -> Path:
    """Write the adapter, the merged model, the card and export.json into ``config.dir``; push them if asked."""
    run = config.run
    checkpoint = run.checkpoint(config.step)
    log.info(f"summrl: export: {run.name} step {config.step} ({why(config)}) from {checkpoint}")
    # Written beside its place and moved in at the end: an interrupted export leaves no half folder at export.dir.
    work = config.dir.parent / f".{config.dir.name}.partial-{os.getpid()}"
    aside = config.dir.parent / f".{config.dir.name}.old-{os.getpid()}"  # the earlier export, until the new one is in
    with contextlib.ExitStack() as held:  # the export's lock, until it is done
        try:  # before the model loads
            config.dir.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(hold_export(config.dir))
            clean_leftovers(config.dir)
            work.mkdir()
        except OSError as e:
            raise ConfigError(f"export.dir={config.dir}: can't write there ({e.strerror or e}: {e.filename or work}); "
                              "choose a folder you can write") from None
        _export(config, command, checkpoint, work, aside)
    return config.dir


def _export(config: ExportConfig, command: str, checkpoint: Path, work: Path, aside: Path) -> None:
    import torch
    from peft import PeftConfig, PeftModel

    from summrl.backends.embedded.engine import load_causal_lm, sorted_sets

    run, model = config.run, config.train.model
    try:
        # float32 for the merge (an exact sum of the base and the LoRA delta), cast to the saved dtype afterwards.
        tokenizer, base = load_causal_lm(model.base_model, model.weights, torch.float32, torch.device("cpu"))

        adapter = work / "adapter"
        adapter.mkdir()
        for name in ADAPTER_FILES:
            shutil.copyfile(checkpoint / name, adapter / name)
        adapter_config = PeftConfig.from_pretrained(str(checkpoint))
        # The checkpoint names the folder it was trained from (a local path, a de-quantization cache); the hub id
        # is what a user of the adapter can load it onto.
        adapter_config.base_model_name_or_path = model.base_model
        adapter_config.inference_mode = True
        sorted_sets(adapter_config).save_pretrained(str(adapter))
        save_tokenizer(tokenizer, adapter)
        log.info(f"summrl: export: adapter (PEFT LoRA r={adapter_config.r}, tokenizer) -> {config.dir / 'adapter'}")

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
            except RuntimeError as e:  # a tensor of another shape: not this model's adapter
                raise ConfigError(f"step={config.step}: its adapter ({checkpoint}) does not fit the run's model "
                                  f"({first_line(e)}): export another step") from None
        # peft loads an adapter with tensors missing and only warns: the export would hold part of it
        missing = [w for w in caught if "missing adapter keys" in str(w.message)]
        if missing:
            raise ConfigError(f"step={config.step}: its adapter ({checkpoint}) lacks tensors of this model's LoRA "
                              f"({first_line(missing[0].message)[:160]}): export another step")
        merged.to(getattr(torch, config.dtype))
        merged.save_pretrained(work / "merged")  # transformers 5 writes safetensors only
        with_legacy_rope(work / "merged" / "config.json")
        save_tokenizer(tokenizer, work / "merged")
        del merged, base
        log.info(f"summrl: export: merged model ({config.dtype}, safetensors) -> {config.dir / 'merged'}")

        (work / "README.md").write_text(model_card(config, command))
        files = {p.relative_to(work).as_posix(): p.stat().st_size for p in sorted(work.rglob("*")) if p.is_file()}
        record = {
            "run": run.name, "run_dir": str(run.run_dir), "step": config.step, "chosen": config.chosen,
            "source_checkpoint": str(checkpoint), "base_model": model.base_model, "weights": model.weights,
            "dtype": config.dtype, "files": files, "command": command,
            "push_to_hub": config.push_to_hub, "summrl": __version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (work / "export.json").write_text(json.dumps(redact(record), indent=2) + "\n")
        readable_as_umask_allows(work)
        # An earlier export (validate_export refused anything else) is moved aside, not deleted, until the new one is
        # in: a kill in between leaves both whole, and the next export puts the earlier one back (clean_leftovers).
        if config.dir.exists():
            os.replace(config.dir, aside)
        os.replace(work, config.dir)
        shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if aside.exists() and not config.dir.exists():
            os.replace(aside, config.dir)
        raise
    log.info(f"summrl: export: model card -> {config.dir / 'README.md'}; record -> {config.dir / 'export.json'}")
    if config.push_to_hub:
        push(config)


def hold_export(target: Path) -> Any:
    """The lock of one export into ``target`` at a time (``.<dir>.lock`` beside it), held until the returned file
    closes: a second export cleaned up the first's unfinished folder as a killed export's leftovers while the first
    was writing it, and the first ended in a traceback. Raises ConfigError naming the other export's pid."""
    path = target.parent / f".{target.name}.lock"
    held = path.open("a+")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        other = held.read().strip() or "?"
        held.close()
        raise ConfigError(f"export.dir={target}: another export into it is running (pid {other}): wait for it to "
                          "end, or set export.dir to another folder") from None
    held.seek(0)
    held.truncate()
    held.write(f"{os.getpid()}\n")
    held.flush()
    return held


def clean_leftovers(target: Path) -> None:
    """Remove what a killed export of ``target`` left beside it: its unfinished ``.<dir>.partial-<pid>`` (a merged
    model's worth of disk; a rerun has another pid and never reused it) and an earlier export it had moved aside
    (``.<dir>.old-<pid>``), which goes back into place if the kill came before the new export was moved in."""
    prefixes = (f".{target.name}.partial-", f".{target.name}.old-")
    for path in sorted(target.parent.iterdir()):
        prefix = next((p for p in prefixes if path.name.startswith(p)), None)
        if prefix is None or not path.name[len(prefix):].isdigit():  # another folder's leftovers, or not ours
            continue
        if prefix.endswith(".old-") and not target.exists():
            os.replace(path, target)
        else:
            shutil.rmtree(path, ignore_errors=True)


def readable_as_umask_allows(folder: Path) -> None:
    """Give every file under ``folder`` the mode a new file gets (0666 less the umask). safetensors writes the merged
    model 0600, so another user of a shared machine could read every exported file but that one."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def push(config: ExportConfig) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    repo = config.push_to_hub
    api = HfApi()
    try:
        api.create_repo(repo_id=repo, repo_type="model", private=config.private, exist_ok=True)
        # adapter/ and merged/ are replaced whole: an earlier push's files this export lacks (other shards) went on
        # sitting beside the new ones; the repo's other files are left alone
        api.upload_folder(repo_id=repo, folder_path=str(config.dir), repo_type="model",
                          delete_patterns=["adapter/*", "merged/*"],
                          commit_message=f"summrl export: {config.run.name} step {config.step}")
    except HfHubHTTPError as e:
        raise PushFailed(f"export.push_to_hub={repo}: the Hub refused the upload ({str(e).splitlines()[0]}); the "
                         f"export is in {config.dir}: check the token's write access to {repo}") from e
    log.info(f"summrl: export: pushed {config.dir} -> https://huggingface.co/{repo}")


def why(config: ExportConfig) -> str:
    if config.chosen == "best":
        record = result(config.run)
        axis = best_axis(record)
        return (f"step=best: the best {axis.replace('val_', 'val ').replace('_', ' ')} "
                f"({_fmt(val_figure(record, config.step, axis))}) in result.json")
    if config.chosen == "latest":
        return "step=latest: the last checkpoint"
    return f"step={config.step}, as asked"


def result(run: TrainedRun) -> dict:
    try:
        return json.loads((run.run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return {}


def val_figure(record: dict, step: int, axis: str) -> Any:
    return next((h.get(axis) for h in reversed(record.get("val_history") or []) if h.get("step") == step), None)


# --------------------------------------------------------------------------- the model card


def _fmt(value: Any) -> str:
    return "" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """The tokenizer, loadable by transformers 4 as well as 5 (checked with 4.57.6: the same ids, special tokens and
    chat template). transformers 5 names a tokenizer built from tokenizer.json alone (the embedded GGUF's)
    "TokenizersBackend", a class transformers 4 (and the vLLM builds on it) does not have, and writes its special
    tokens as a list "extra_special_tokens", which transformers 4 reads as a mapping and fails on: both versions
    read "PreTrainedTokenizerFast" and "additional_special_tokens"."""
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    settings = json.loads(path.read_text())
    if settings.get("tokenizer_class") == "TokenizersBackend":
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(settings.get("extra_special_tokens"), list):
        settings["additional_special_tokens"] = settings.pop("extra_special_tokens")
    # transformers 4's PreTrainedTokenizerFast also returns token_type_ids, which generate() refuses for a Llama
    settings["model_input_names"] = list(tokenizer.model_input_names)
    path.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")


def with_legacy_rope(path: Path) -> None:
    """transformers 5 writes RoPE's settings as "rope_parameters", which transformers 4 does not read: it took its
    default rope_theta (10,000 for Llama; SmolLM2's is 100,000) and generated other text, without a word. The old keys
    go beside them (checked with 4.57.6: the same greedy text as transformers 5)."""
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope or "rope_theta" in config:
        return  # none, per layer type, or already there
    config["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    path.write_text(json.dumps(config, indent=2) + "\n")


def model_card(config: ExportConfig, command: str) -> str:
    from huggingface_hub import ModelCardData

    from summrl.data import Document
    from summrl.prompt import SummaryPrompt

    run, train = config.run, config.train
    model, trainer = train.model, train.trainer
    record = result(run)
    data = ModelCardData(base_model=model.base_model, library_name="transformers", pipeline_tag="text-generation",
                         tags=["summrl", "summarization", "grpo", "lora", "openpipe-art"],
                         **LICENSES.get(model.base_model, {}))
    recorded = [h for h in record.get("val_history") or [] if isinstance(h, dict)]
    # the scores measured as the latest was, as step=best ranks them: online learning's (val_set) are of its own val
    # documents and reward, and were listed under the original split's heading beside its scores
    history = comparable(recorded)
    key = history[-1].get("val_set") if history else None  # inbox:<reward>, or None: the run's val split
    saved = record.get("config") or {}  # the run's last training invocation's, which measured them
    reward = key.split(":")[1] if key else saved.get("reward.kind", train.reward.kind)
    val_size = saved.get("dataset.val_size", train.dataset.val_size)
    rollouts = saved.get("trainer.val_rollouts_per_doc", trainer.val_rollouts_per_doc)
    measured = (f"the online val set (the first dataset.val_size={val_size} documents recorded in the run's inbox, "
                f"val_set {key}" if key else f"the val split (dataset.val_size={val_size}")
    left_out = (f" Left out: {len(recorded) - len(history)} score(s) measured on other val documents or with another "
                "reward, which don't compare." if len(history) < len(recorded) else "")
    rows = "\n".join(
        f"| {h.get('step')}{' (exported)' if h.get('step') == config.step else ''} | {_fmt(h.get('val_reward'))} | "
        f"{_fmt(h.get('val_qa_accuracy'))} | {_fmt(h.get('val_hallucination_rate'))} |" for h in history)
    scores = ("| step | val reward | val QA accuracy | val hallucination rate |\n| ---: | ---: | ---: | ---: |\n" + rows
              if rows else "No val scores were recorded (result.json has no val_history).")
    # The run's settings that shaped the model; storage, logger and run paths say where, not what, and are left out.
    settings = {name: dataclasses.asdict(getattr(train, name))
                for name in ("model", "dataset", "algorithm", "reward", "judge", "backend", "trainer")}
    settings["seed"] = train.seed
    settings_yaml = OmegaConf.to_yaml(OmegaConf.create(redact(settings)))
    sentinel = "\x00DOCUMENT\x00"  # the training prompt, from summrl.prompt, with the document left as a variable
    messages = SummaryPrompt.of(trainer).messages(Document(id="doc", topic="", text=sentinel, questions=()))
    head, tail = messages[1]["content"].split(sentinel)
    # the template's own settings the run trained and served with (model=qwen3_8b: enable_thinking=False)
    template = dict(model.chat_template_kwargs or {})
    kwargs = ("".join(f", {k}={v!r}" for k, v in template.items()) if all(k.isidentifier() for k in template)
              else f", **{template!r}")
    gguf = str(model.weights or "").endswith(".gguf")
    trained_on = (f"`{model.weights}` (de-quantized; the merged model is saved in {config.dtype})" if gguf
                  else f"`{model.weights}`" if model.weights else f"`{model.base_model}`")
    stages = ", ".join(f"{s} ({run.stage(s)})" for s in run.steps) or "none"
    return f"""---
{data.to_yaml()}
---

# {run.name}, step {config.step}: a document summarizer trained with GRPO

A LoRA adapter on [{model.base_model}](https://huggingface.co/{model.base_model}), trained by
summrl {__version__} with GRPO on OpenPipe ART to summarize documents (reward={train.reward.kind},
trainer.prompt={trainer.prompt}: the prompt is under Usage). The base weights the run trained on: {trained_on}.

- `adapter/`: the PEFT LoRA adapter (r={model.lora.r}, alpha={model.lora.alpha}) and the tokenizer;
- `merged/`: the base model with the adapter merged, {config.dtype}, safetensors: load it with
  `AutoModelForCausalLM.from_pretrained`;
- `export.json`: the source checkpoint and the files.

## Which step

Exported: step {config.step} ({why(config)}). Steps trained: {record.get('steps', run.steps[-1] if run.steps else 0)}
(run status: {record.get('status', 'unknown')}); checkpoints: {stages}.

## Val scores per step

Step 0 is the base model. The val reward is the training reward (reward={reward}), averaged over {measured},
trainer.val_rollouts_per_doc={rollouts}).{left_out}

{scores}

## Usage

The model was trained on this prompt; give it the same one:

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

path = "merged"  # this folder's merged/; from the Hub: from_pretrained("<repo>", subfolder="merged")
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)

document = "..."
messages = [
    {{"role": "system", "content": {messages[0]['content']!r}}},
    {{"role": "user", "content": {head!r} + document + {tail!r}}},
]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True{kwargs})
output = model.generate(**inputs, max_new_tokens={trainer.max_summary_tokens}, do_sample=False)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```

With the adapter instead: `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("{model.base_model}"),
"adapter")`.

## Training config

The run's training config (from `.hydra/` in its folder; choices: {', '.join(f'{k}={v}' for k, v in
(record.get('choices') or {}).items()) or 'unknown'}):

```yaml
{settings_yaml.rstrip()}
```

## How this was made

```
{command}
```
"""


# --------------------------------------------------------------------------- the CLI


def command_line(overrides: list[str]) -> str:
    """The command that made the export, as a user can run it again (secret values masked)."""
    return redact_text(" ".join(["python -m summrl.export", *map(shlex.quote, overrides)]))


def run_export(cfg: DictConfig, overrides: list[str]) -> Path:
    """What the CLI does with a composed conf/export.yaml and its command-line overrides."""
    config = validate_export(cfg)
    os.environ.setdefault("TQDM_DISABLE", "1")
    return export(config, command_line(overrides))


@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run_export(cfg, task_overrides(HydraConfig.get()))
    except Exception as e:
        exit_on(e)


if __name__ == "__main__":
    cli.run(main)
