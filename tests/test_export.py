"""summrl.export: a trained run's checkpoint as a PEFT adapter, a merged transformers model and a model card.

The run is the session's shared one (conftest.shared_run: the tiny model, steps 1-3 with reward=ruler on the loopback
judge, whose scores differ within a group so the LoRA weights move; steps 2 and 3 kept, step 1 gone with the folder
the rerun restored from S3). It is copied, never changed, and exported once through the CLI's own function; the
entry point itself runs as a subprocess where its exit matters.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from summrl.config import compose
from summrl.errors import ConfigError
from summrl.prompt import SummaryPrompt
from tests.conftest import ROOT, SHARED_SECRET

FACTS = SummaryPrompt("facts", 350)  # experiment=local's prompt

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def copy_run(run_dir: Path, to: Path) -> Path:
    """A run folder's copy without its exports: to export into, or to change result.json in."""
    shutil.copytree(run_dir, to, ignore=shutil.ignore_patterns("export"))
    return to


@pytest.fixture(scope="module")
def trained(shared_run, tmp_path_factory) -> Path:
    return copy_run(shared_run.run_dir, tmp_path_factory.mktemp("export") / "run")


def export_cli(args: list[str], cwd: Path, env: dict | None = None):
    """The entry point as a user runs it, from ``cwd`` (where it must write nothing)."""
    return subprocess.run([sys.executable, "-m", "summrl.export", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**(env or os.environ), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})


@dataclass
class Exported:
    folder: Path
    said: str  # what the export printed (summrl's INFO lines go to stdout under the CLI)


@pytest.fixture(scope="module")
def exported(trained) -> Exported:
    """``python -m summrl.export run_dir=<run> step=latest`` (the default folder and dtype), in-process: the CLI's own
    function on the composed config, without the subprocess's 8 s of imports. The subprocess tests below run the
    entry point itself."""
    from summrl.export import run_export

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("summrl.export")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        overrides = [f"run_dir={trained}", "step=latest"]
        folder = run_export(compose("export", overrides), overrides)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return Exported(folder, "\n".join(lines))


def checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / "art" / "summrl" / "models" / "shared" / "checkpoints" / f"{step:04d}"


def weights_folder(tiny_weights: str) -> str:
    return tiny_weights.split("=", 1)[1]


def test_export_writes_the_adapter_the_merged_model_and_a_record(trained, exported):
    folder = trained / "export" / "step-3"
    assert exported.folder == folder
    source = checkpoint(trained, 3)
    assert exported.said.startswith(f"summrl: export: shared step 3 (step=latest: the last checkpoint) from {source}")
    for line in (f"adapter (PEFT LoRA r=16, tokenizer) -> {folder / 'adapter'}",
                 f"merged model (float32, safetensors) -> {folder / 'merged'}", f"model card -> {folder / 'README.md'}"):
        assert f"summrl: export: {line}" in exported.said

    adapter = folder / "adapter"
    assert (adapter / "adapter_model.safetensors").read_bytes() == (source / "adapter_model.safetensors").read_bytes()
    assert not (adapter / "optimizer.pt").exists()
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == BASE_MODEL and config["r"] == 16 and config["lora_alpha"] == 32
    assert config["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert (adapter / "tokenizer.json").is_file() and (folder / "merged" / "tokenizer.json").is_file()
    assert (folder / "merged" / "model.safetensors").is_file() and not list(folder.rglob("*.bin"))
    assert json.loads((folder / "merged" / "config.json").read_text())["dtype"] == "float32"  # the run's backend.dtype

    record = json.loads((folder / "export.json").read_text())
    assert record["step"] == 3 and record["chosen"] == "latest" and record["source_checkpoint"] == str(source)
    assert record["base_model"] == BASE_MODEL and record["dtype"] == "float32"
    assert record["command"] == f"python -m summrl.export run_dir={trained} step=latest"
    assert record["files"]["merged/model.safetensors"] == (folder / "merged" / "model.safetensors").stat().st_size
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == [".step-3.lock"], (
        "no partial folder is left behind; the lock file stays (an export deleting it could let two others in)")
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.relative_to(folder).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.rglob("*")
             if p.is_file()}
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask)), "the merged model was written 0600"


def test_an_export_into_an_earlier_one_holding_the_users_own_files_is_refused(trained, exported, tmp_path):
    """A GGUF converted from merged/, or a clone of the pushed Hub repo (.git, .gitattributes): the export replaced
    the whole folder and deleted them, exit 0, without a word."""
    from summrl.errors import ConfigError
    from summrl.export import validate_export

    out = tmp_path / "out"
    shutil.copytree(exported.folder, out)
    (out / "summarizer-q4_k_m.gguf").write_text("converted")
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main")
    overrides = [f"run_dir={trained}", "step=2", f"export.dir={out}"]
    with pytest.raises(ConfigError, match=r"holds 2 file\(s\) the earlier export did not write \(.git/HEAD, "
                                          r"summarizer-q4_k_m.gguf\): an export replaces the whole folder"):
        validate_export(compose("export", overrides))
    assert (out / "summarizer-q4_k_m.gguf").is_file() and (out / ".git" / "HEAD").is_file()


def test_an_export_replaces_the_earlier_one_and_clears_what_a_killed_export_left(trained, exported, tmp_path):
    """A killed export left its finished or half-built ``.<dir>.partial-<pid>`` (a merged model's worth of disk, never
    reused: a rerun has another pid) and, killed while swapping, the earlier export moved aside."""
    from summrl.export import run_export

    out = tmp_path / "out"
    shutil.copytree(exported.folder, out)  # an earlier export, with a file this one does not write
    (out / "earlier.txt").write_text("the earlier export")
    earlier = json.loads((out / "export.json").read_text())
    (out / "export.json").write_text(json.dumps({**earlier, "files": {**earlier["files"], "earlier.txt": 18}}))
    for stale in (".out.partial-999991", ".out.old-999992"):
        shutil.copytree(exported.folder / "merged", tmp_path / stale / "merged")
    (tmp_path / ".out.partial-mine").mkdir()  # not an export's leftover (no pid): kept
    (tmp_path / ".other.partial-999993").mkdir()  # another folder's: kept

    overrides = [f"run_dir={trained}", "step=2", f"export.dir={out}"]
    assert run_export(compose("export", overrides), overrides) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.partial-999993", ".out.lock", ".out.partial-mine",
                                                           "out"]
    record = json.loads((out / "export.json").read_text())
    assert record["step"] == 2 and not (out / "earlier.txt").exists()
    assert record["files"] == {p.relative_to(out).as_posix(): p.stat().st_size for p in out.rglob("*")
                               if p.is_file() and p.name != "export.json"}

    # Killed between moving the earlier export aside and moving the new one in: the earlier one goes back.
    from summrl.export import clean_leftovers

    os.replace(out, tmp_path / ".out.old-999994")
    (tmp_path / ".out.partial-999995").mkdir()
    clean_leftovers(out)
    assert json.loads((out / "export.json").read_text()) == record
    assert not list(tmp_path.glob(".out.*-99999*"))

    # Another export into the same folder still running: a second one removed its unfinished folder as a killed
    # export's leftovers, and the first ended in a traceback. Now the second is refused, naming the first.
    from summrl.errors import ConfigError
    from summrl.export import hold_export

    with hold_export(out):  # (flock: a second open file of this process is refused as another process's would be)
        (tmp_path / ".out.partial-999996").mkdir()  # what the running export is writing
        with pytest.raises(ConfigError, match=rf"^export.dir={re.escape(str(out))}: another export into it is running "
                                              rf"\(pid {os.getpid()}\): wait for it to end"):
            run_export(compose("export", overrides), overrides)
        assert (tmp_path / ".out.partial-999996").is_dir()
    assert json.loads((out / "export.json").read_text()) == record


def test_merged_model_generates_what_the_adapter_and_the_served_checkpoint_generate(trained, exported, tiny_weights):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from summrl.backends.embedded.engine import Engine, SamplingParams
    from summrl.checkpoints import run_config, trained_run
    from summrl.data import Document

    folder = exported.folder
    tokenizer = AutoTokenizer.from_pretrained(folder / "merged")
    # decoded as summrl.serve and vLLM decode: no BERT-era clean-up of spaces ("x 's y" was "x's y")
    assert tokenizer.decode(tokenizer("x 's y .", add_special_tokens=False)["input_ids"]) == "x 's y ."
    document = Document(id="d", topic="", text="The Harbor Festival in Townsville drew 4,200 visitors on June 3, 2024.",
                         questions=())
    inputs = tokenizer.apply_chat_template(FACTS.messages(document), add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)

    def greedy(model) -> tuple[list[int], torch.Tensor]:
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        return out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), out.logits[0][0]

    merged = AutoModelForCausalLM.from_pretrained(folder / "merged").eval()
    merged_tokens, merged_logits = greedy(merged)
    del merged
    base = AutoModelForCausalLM.from_pretrained(weights_folder(tiny_weights)).eval()
    _, base_logits = greedy(base)
    with_adapter = PeftModel.from_pretrained(base, folder / "adapter").eval()
    adapter_tokens, adapter_logits = greedy(with_adapter)
    del with_adapter, base

    assert len(merged_tokens) == 16
    assert merged_tokens == adapter_tokens
    assert torch.allclose(merged_logits, adapter_logits, atol=1e-4)
    assert (merged_logits - base_logits).abs().max() > 1e-2, "the adapter changes the model: the comparison means something"

    # the checkpoint as summrl.serve serves it: the embedded engine with the LoRA loaded, greedy
    config = run_config(trained_run(trained))
    engine = Engine(base_model=config.model.base_model, weights=config.model.weights, lora=config.model.lora)
    engine.load_checkpoint(checkpoint(trained, 3))
    (served,) = engine.generate([inputs["input_ids"][0].tolist()], SamplingParams(max_tokens=16, temperature=0.0))
    assert served.token_ids == merged_tokens


def test_model_card_names_the_base_model_the_step_the_val_scores_and_the_command(trained, exported):
    from huggingface_hub import ModelCard

    from summrl.data import Document

    card = ModelCard.load(exported.folder / "README.md")
    assert card.data.base_model == BASE_MODEL and card.data.library_name == "transformers"
    assert card.data.license == "apache-2.0" and "summrl" in card.data.tags
    text = card.text
    prose = " ".join(text.split())  # markdown's line breaks within a paragraph mean nothing
    assert "Exported: step 3 (step=latest: the last checkpoint)" in prose
    assert "Steps trained: 3 (run status: completed); checkpoints: 2 (grpo), 3 (grpo)" in prose
    history = json.loads((trained / "result.json").read_text())["val_history"]
    for h in history:
        label = f"{h['step']} (exported)" if h["step"] == 3 else str(h["step"])
        assert f"| {label} | {h['val_reward']:.3f} | {h['val_qa_accuracy']:.3f} |" in text
    assert f"```\npython -m summrl.export run_dir={trained} step=latest\n```" in text
    assert "max_summary_tokens: 16" in text and "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in text
    assert SHARED_SECRET not in text and "FAKE_JUDGE_KEY" in text  # the key's variable, never its value

    # the usage example's messages are the training prompt (summrl.prompt), whatever the document
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    messages = eval(re.search(r"^messages = (\[.*?^\])", code, re.S | re.M).group(1), {"document": "Some text."})
    assert messages == FACTS.messages(Document(id="x", topic="", text="Some text.", questions=()))



def test_the_model_cards_usage_renders_the_prompt_with_the_runs_chat_template_settings(trained, tmp_path):
    """A run with model.chat_template_kwargs (model=qwen3_8b: enable_thinking=False) trained and served with them;
    the card's usage code left them out, so its prompt (Qwen3's thinking one) was not the one the model learned."""
    from summrl.export import model_card, validate_export

    config = validate_export(compose("export", [f"run_dir={trained}"]))
    config.train.model.chat_template_kwargs = {"enable_thinking": False}
    code = re.search(r"```python\n(.*?)```", model_card(config, "cmd"), re.S).group(1)
    call = re.search(r"^inputs = (tokenizer\.apply_chat_template\(.*?\))$", code, re.M).group(1)
    asked = {}
    tokenizer = SimpleNamespace(apply_chat_template=lambda messages, **kwargs: asked.update(kwargs))
    eval(call, {"tokenizer": tokenizer, "messages": []})
    assert asked == {"add_generation_prompt": True, "return_tensors": "pt", "return_dict": True,
                     "enable_thinking": False}


def test_the_model_cards_val_scores_are_those_comparable_with_the_latest_under_their_own_heading(trained, tmp_path):
    """After online learning the card listed the original split's scores and the inbox's together (step 2 twice:
    1.000 and 0.581) under a heading naming the original val split's size."""
    from summrl.export import model_card, validate_export

    run = copy_run(trained, tmp_path / "run")
    record = json.loads((run / "result.json").read_text())
    original = record["val_history"]
    online = [{**h, "val_set": "inbox:qa", "val_reward": r, "val_qa_accuracy": r, "val_hallucination_rate": 0.0}
              for h, r in zip([h for h in original if h["step"] in (2, 3)], (0.581, 0.625))]
    config = {**record["config"], "dataset.val_size": 4, "reward.kind": "qa"}  # the online run's
    (run / "result.json").write_text(json.dumps({**record, "val_history": original + online, "config": config}))
    text = model_card(validate_export(compose("export", [f"run_dir={run}", "step=latest"])), "cmd")
    table = [line for line in text.splitlines() if re.match(r"\| \d", line)]
    assert table == ["| 2 | 0.581 | 0.581 | 0.000 |", "| 3 (exported) | 0.625 | 0.625 | 0.000 |"]
    prose = " ".join(text.split())
    assert ("The val reward is the training reward (reward=qa), averaged over the online val set (the first "
            "dataset.val_size=4 documents recorded in the run's inbox, val_set inbox:qa, "
            "trainer.val_rollouts_per_doc=") in prose
    assert f"Left out: {len(original)} score(s) measured on other val documents or with another reward" in prose


def test_step_best_latest_and_a_number(trained, tmp_path):
    from summrl.export import validate_export

    run = copy_run(trained, tmp_path / "run")
    record = json.loads((run / "result.json").read_text())
    # a RULER run: its val reward is a mean of scores that compare only within a group; best is by QA accuracy
    assert record["best_by"] == "val_qa_accuracy"
    for h in record["val_history"]:
        h["val_qa_accuracy"] = {0: 0.1, 1: 0.9, 2: 0.6, 3: 0.4}[h["step"]]  # step 1 has no checkpoint left
        h["val_reward"] = {0: 0.1, 1: 0.9, 2: 0.4, 3: 0.6}[h["step"]]
    (run / "result.json").write_text(json.dumps(record))

    def config(*overrides):
        return validate_export(compose("export", [f"run_dir={run}", *overrides]))

    best = config()
    assert (best.step, best.chosen, best.dir) == (2, "best", run / "export" / "step-2")
    (run / "result.json").write_text(json.dumps({**record, "best_by": "val_reward"}))  # a run of another reward
    assert config().step == 3
    (run / "result.json").write_text(json.dumps(record))
    latest = config("step=latest")
    assert (latest.step, latest.chosen, latest.dir) == (3, "latest", run / "export" / "step-3")
    asked = config("step=3", f"export.dir={tmp_path / 'out'}", "export.dtype=bfloat16", "export.private=false")
    assert (asked.step, asked.chosen, asked.dir, asked.dtype, asked.private) == (3, "asked", tmp_path / "out",
                                                                                  "bfloat16", False)
    assert best.dtype == "float32" and best.private is True and best.push_to_hub is None

    with pytest.raises(ConfigError, match=r"step=0: step 0 is the base model; there is no adapter"):
        config("step=0")
    for h in record["val_history"]:
        h["val_qa_accuracy"] = {0: 0.9, 1: 0.6, 2: 0.6, 3: 0.4}[h["step"]]
    (run / "result.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"step=best: step 0 is the base model \(it scored best\).*one of 2, 3\)$"):
        config()
    config("step=latest")  # a trained step is still there to export
    with pytest.raises(ConfigError, match=r"^export\.dtype: must be one of float32, bfloat16, float16"):
        config("step=3", "export.dtype=float8")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"^export\.dir: .*busy exists and is not an earlier export"):
        config("step=3", f"export.dir={tmp_path / 'busy'}")
    with pytest.raises(ConfigError, match=r"^run_dir: .*nowhere is not a folder"):
        validate_export(compose("export", [f"run_dir={tmp_path / 'nowhere'}"]))


def test_a_bad_step_is_one_line_and_exit_2_before_any_model_loads(trained, tmp_path):
    process = export_cli([f"run_dir={trained}", "step=1"], cwd=tmp_path)  # trained, but its checkpoint is gone
    assert process.returncode == 2
    assert process.stderr.strip().splitlines() == [
        f"summrl: config error: step=1: not a checkpoint of {trained}: use best, latest or one of 0 (the base model), 2, 3"]
    assert not (trained / "export" / "step-1").exists()
    assert not list(tmp_path.iterdir()), "nothing in the current folder (no export.log, no Hydra output)"
    assert "summrl: export:" not in process.stdout, "refused before the export began"


def test_a_damaged_checkpoint_is_one_line_and_exit_2_and_a_partial_adapter_is_never_exported(trained, tmp_path):
    """A checkpoint whose weights can't be read was a traceback (exit 1); one lacking tensors exported with half its
    adapter and a warning (exit 0)."""
    from safetensors.torch import load_file, save_file

    run = copy_run(trained, tmp_path / "run")
    checkpoints = run / "art" / "summrl" / "models" / "shared" / "checkpoints"
    (checkpoints / "0002" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    tensors = load_file(checkpoints / "0003" / "adapter_model.safetensors")
    save_file(dict(list(tensors.items())[1:]), checkpoints / "0003" / "adapter_model.safetensors")
    unreadable = export_cli([f"run_dir={run}", "step=2"], cwd=tmp_path)
    assert unreadable.returncode == 2, unreadable.stderr[-2000:]
    (line,) = unreadable.stderr.strip().splitlines()
    assert line.startswith(f"summrl: config error: step=2: its checkpoint ({checkpoints / '0002'}) can't be read (")
    assert line.endswith("): export another step") and "summrl: export:" not in unreadable.stdout
    partial = export_cli([f"run_dir={run}", "step=3"], cwd=tmp_path)
    assert partial.returncode == 2, partial.stderr[-2000:]
    assert partial.stderr.strip().splitlines()[-1].startswith(
        f"summrl: config error: step=3: its adapter ({checkpoints / '0003'}) lacks tensors of this model's LoRA (")
    assert not (run / "export" / "step-3").exists() and not list((run / "export").glob(".step-3.partial*"))


def test_an_export_dir_that_cant_be_written_is_one_line_and_exit_2_before_any_model_loads(trained, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    process = export_cli([f"run_dir={trained}", "step=2", f"export.dir={tmp_path / 'a-file' / 'out'}"], cwd=tmp_path)
    assert process.returncode == 2, process.stderr
    (line,) = process.stderr.strip().splitlines()
    assert line.startswith(f"summrl: config error: export.dir={tmp_path / 'a-file' / 'out'}: can't write there (")
    assert line.endswith("choose a folder you can write") and "merged model" not in process.stdout


def test_push_to_hub_without_a_token_fails_before_any_work(trained, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")  # no cached login either
    process = export_cli([f"run_dir={trained}", "step=2", f"export.dir={tmp_path / 'out'}",
                          "export.push_to_hub=me/summarizer"], cwd=tmp_path, env=env)
    assert process.returncode == 2
    assert process.stderr.strip().splitlines() == [
        "summrl: config error: export.push_to_hub=me/summarizer: no Hugging Face token; export HF_TOKEN=<a write token> "
        "or run `hf auth login`, or leave export.push_to_hub unset to export locally only"]
    assert not (tmp_path / "out").exists() and "summrl: export:" not in process.stdout

    # HF_HUB_OFFLINE (natural for a tool that runs offline): the push ended in a traceback after the whole export
    process = export_cli([f"run_dir={trained}", "step=2", f"export.dir={tmp_path / 'out'}",
                          "export.push_to_hub=me/summarizer"], cwd=tmp_path,
                         env={**env, "HF_TOKEN": "hf_planted_token_for_the_test", "HF_HUB_OFFLINE": "1"})
    assert process.returncode == 2
    assert process.stderr.strip().splitlines() == [
        "summrl: config error: export.push_to_hub=me/summarizer: HF_HUB_OFFLINE is set, so the Hub can't be reached "
        "(the push ended in a traceback after the whole export); unset it to push, or leave export.push_to_hub unset to "
        "export locally only"]
    assert not (tmp_path / "out").exists()


def test_push_to_hub_uploads_the_export_folder(trained, tmp_path, monkeypatch):
    """The upload at its boundary: HfApi's calls recorded instead of sent. Step 2, saved in bfloat16."""
    from huggingface_hub import HfApi
    from safetensors import safe_open

    from summrl.export import export, validate_export

    from huggingface_hub import constants

    token = "hf_planted_0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a machine set offline: the upload is recorded anyway
    calls = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, **kw: calls.append(("create_repo", kw)))

    def upload_folder(self, **kw):
        listing = sorted(p.relative_to(kw["folder_path"]).as_posix() for p in Path(kw["folder_path"]).rglob("*"))
        calls.append(("upload_folder", {**kw, "listing": listing}))

    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    out = tmp_path / "out"
    config = validate_export(compose("export", [f"run_dir={trained}", "step=2", f"export.dir={out}",
                                                "export.dtype=bfloat16", "export.push_to_hub=me/summarizer"]))
    export(config, "python -m summrl.export ...")

    assert calls[0] == ("create_repo", {"repo_id": "me/summarizer", "repo_type": "model", "private": True,
                                        "exist_ok": True})
    name, upload = calls[1]
    assert name == "upload_folder" and len(calls) == 2
    assert (upload["repo_id"], upload["folder_path"], upload["repo_type"]) == ("me/summarizer", str(out), "model")
    assert upload["delete_patterns"] == ["adapter/*", "merged/*"]  # an earlier push's other shards stayed
    assert {"README.md", "export.json", "adapter/adapter_model.safetensors", "merged/model.safetensors"} <= set(
        upload["listing"])
    assert json.loads((out / "export.json").read_text())["step"] == 2
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() == (
        checkpoint(trained, 2) / "adapter_model.safetensors").read_bytes()
    with safe_open(out / "merged" / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert json.loads((out / "merged" / "config.json").read_text())["dtype"] == "bfloat16"
    assert not any(token in p.read_text(errors="ignore") for p in out.rglob("*") if p.is_file()
                   and p.stat().st_size < 10_000_000)


def test_a_bad_repo_id_is_refused(trained, monkeypatch):
    from summrl.export import validate_export

    monkeypatch.setenv("HF_TOKEN", "hf_planted")
    with pytest.raises(ConfigError, match=r"^export\.push_to_hub=summarizer: not a Hub repo id .*<user or org>/<name>"):
        validate_export(compose("export", [f"run_dir={trained}", "export.push_to_hub=summarizer"]))


def test_a_run_trained_on_a_gguf_file_is_exported_de_quantized_in_the_saved_dtype(shared_run, tmp_path):
    """experiment=local trains on SmolLM2's Q4_1 GGUF file. A run folder as training leaves it, whose step-1 adapter
    peft made (random, non-zero) instead of training the full 30-layer model here; exported in bfloat16."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from summrl.backends.embedded.engine import load_causal_lm
    from summrl.export import export, validate_export
    from summrl.storage import TRAINED_CONFIG
    from tests.conftest import compose_config

    gguf = compose_config(["experiment=local"]).model.weights
    assert gguf.endswith(".gguf")
    run = tmp_path / "run"
    shutil.copytree(shared_run.run_dir / ".hydra", run / ".hydra")
    shutil.copy(shared_run.run_dir / "result.json", run / "result.json")
    saved = (run / TRAINED_CONFIG).read_text()  # what export reads
    (run / TRAINED_CONFIG).write_text(re.sub(r"(?m)^  weights: .*$", f"  weights: {gguf}", saved))

    _, base = load_causal_lm(BASE_MODEL, gguf, torch.float32, torch.device("cpu"))  # the de-quantized weights
    lora = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    lora.save_pretrained(checkpoint(run, 1))
    layer = lora.base_model.model.model.layers[0].self_attn.q_proj
    expected = (layer.base_layer.weight + layer.lora_B.default.weight @ layer.lora_A.default.weight * 2.0).detach()
    original = layer.base_layer.weight.detach().clone()
    del lora, base

    out = tmp_path / "out"
    export(validate_export(compose("export", [f"run_dir={run}", "step=1", f"export.dir={out}",
                                              "export.dtype=bfloat16"])), "python -m summrl.export ...")
    with safe_open(out / "merged" / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        merged = f.get_tensor("model.layers.0.self_attn.q_proj.weight").float()
    assert torch.allclose(merged, expected, rtol=2**-7, atol=1e-6)  # the float32 merge, rounded once to bfloat16
    assert (merged - original).abs().max() > 0.01  # the adapter moved the weights (0.05 seen), beyond bf16 rounding
    assert not list(out.rglob("*.gguf"))
    model = AutoModelForCausalLM.from_pretrained(out / "merged", dtype="auto")
    assert model.dtype == torch.bfloat16 and model.config.num_hidden_layers == 30
    # transformers 5 named the GGUF's tokenizer "TokenizersBackend", a class transformers 4 (and vLLM on it) lacks
    from transformers import AutoTokenizer

    # and its special tokens as a list under a key transformers 4 reads as a mapping
    for folder in (out / "adapter", out / "merged"):
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        assert settings["tokenizer_class"] == "PreTrainedTokenizerFast" and "extra_special_tokens" not in settings
        assert "<|im_end|>" in settings["additional_special_tokens"]
        # transformers 4's fast tokenizer also returned token_type_ids, which generate() refuses for a Llama
        assert settings["model_input_names"] == ["input_ids", "attention_mask"]
    # transformers 4 reads rope_theta, not transformers 5's rope_parameters: it took 10,000, not SmolLM2's 100,000,
    # and generated other text (4.57.6 checked by hand: with these keys, the same greedy text as 5)
    saved = json.loads((out / "merged" / "config.json").read_text())
    assert saved["rope_theta"] == saved["rope_parameters"]["rope_theta"] == 100000.0 and "rope_scaling" not in saved
    assert AutoModelForCausalLM.from_pretrained(out / "merged").config.rope_parameters["rope_theta"] == 100000.0
    tokenizer = AutoTokenizer.from_pretrained(out / "merged")
    assert tokenizer.eos_token == "<|im_end|>" and "<|im_start|>" in tokenizer.all_special_tokens
    from summrl.backends.embedded.engine import gguf_tokenizer
    from summrl.data.document import resolve_path

    text = "A café, 2,100 ¥."
    assert tokenizer(text)["input_ids"] == gguf_tokenizer(resolve_path(gguf))(text)["input_ids"]


def test_every_shipped_base_model_has_a_license_for_the_model_card():
    """Three of the five shipped models got a card without a license."""
    import yaml

    from summrl.export import LICENSES

    shipped = {yaml.safe_load(path.read_text())["base_model"] for path in (ROOT / "conf" / "model").glob("*.yaml")}
    assert len(shipped) >= 5 and shipped <= set(LICENSES), sorted(shipped - set(LICENSES))


def test_a_refused_resume_leaves_serve_and_export_the_config_the_run_trained_with(shared_run, tiny_weights, tmp_path):
    """Hydra writes .hydra/config.yaml before summrl checks anything: a resume refused for other weights left its own
    config there, and serve and export then loaded those weights under the run's adapter (found by a review)."""
    from omegaconf import OmegaConf

    from summrl.checkpoints import run_config, trained_run
    from tests.conftest import SHARED_ARGS

    run = copy_run(shared_run.run_dir, tmp_path / "run")
    trained_with = tiny_weights.split("=", 1)[1]
    other = shutil.copytree(trained_with, tmp_path / "other-weights")  # loadable, and of the same shape
    args = [a for a in SHARED_ARGS if not a.startswith("storage.")]
    refused = subprocess.run([sys.executable, "-m", "summrl.train", *args, f"model.weights={other}",
                              "judge.api_base=http://127.0.0.1:9/v1", f"hydra.run.dir={run}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "FAKE_JUDGE_KEY": SHARED_SECRET})
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "resumes a run trained with model.weights=" in refused.stderr
    assert OmegaConf.load(run / ".hydra" / "config.yaml").model.weights == str(other)  # Hydra's, of the refused one
    assert run_config(trained_run(run)).model.weights == trained_with
