"""S3 backup and resume against a real S3 endpoint on loopback (moto's server, reached over HTTP by boto3)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil

import pytest

from summrl.storage import COMPLETE, CheckpointBackup, StorageError, fetch_file, fetch_result, sft_files
from tests.conftest import compose_config, keys, s3, said

def storage_config(tmp_path, endpoint, bucket, *extra):
    return compose_config(["experiment=local", "run.name=r1", "storage.enabled=true", f"storage.bucket={bucket}",
                           f"storage.endpoint_url={endpoint}", *extra, f"run.dir={tmp_path / 'run'}"])


def write_checkpoint(config, step, payload):
    folder = CheckpointBackup.open(config).local / "checkpoints" / f"{step:04d}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(payload)
    (folder / "optimizer.pt").write_bytes(payload[::-1])
    return folder


def test_bucket_is_created_when_missing_or_named_in_the_error(tmp_path, s3_endpoint, aws_env):
    with pytest.raises(StorageError, match="storage.create_bucket=true"):
        CheckpointBackup.open(storage_config(tmp_path, s3_endpoint, "absent-bucket", "storage.create_bucket=false"))
    CheckpointBackup.open(storage_config(tmp_path, s3_endpoint, "created-bucket"))
    assert "created-bucket" in [b["Name"] for b in s3(s3_endpoint).list_buckets()["Buckets"]]


def test_backups_on_need_a_bucket(tmp_path, aws_env):
    config = compose_config(["experiment=local", "storage.enabled=true", f"run.dir={tmp_path}"])
    with pytest.raises(StorageError, match="BACKUP_BUCKET"):
        CheckpointBackup.open(config)


def test_bucket_comes_from_backup_bucket_env_and_is_not_echoed(tmp_path, s3_endpoint, aws_env, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="summrl")
    monkeypatch.setenv("BACKUP_BUCKET", "env-bucket-4Qz")
    config = compose_config(["experiment=local", "run.name=r1", "storage.enabled=true",
                             f"storage.endpoint_url={s3_endpoint}", f"run.dir={tmp_path / 'run'}"])
    backup = CheckpointBackup.open(config)
    write_checkpoint(config, 1, b"weights")
    asyncio.run(backup.after_step(1))
    assert backup.bucket == "env-bucket-4Qz" and backup.complete_steps() == [1]
    out = said(caplog, logging.INFO)
    assert "step 1 backed up to s3://$BACKUP_BUCKET/summrl/summrl/r1" in out and "env-bucket-4Qz" not in out


def test_interrupted_upload_is_ignored_and_the_last_complete_step_restored(tmp_path, s3_endpoint, aws_env):
    config = storage_config(tmp_path, s3_endpoint, "interrupted")
    backup = CheckpointBackup.open(config)
    write_checkpoint(config, 1, b"step one weights" * 100)
    asyncio.run(backup.after_step(1))
    # Step 2's files land but the upload dies before its marker.
    step2 = write_checkpoint(config, 2, b"step two weights" * 100)
    for path in step2.iterdir():
        s3(s3_endpoint).upload_file(str(path), "interrupted", f"summrl/summrl/r1/checkpoints/0002/{path.name}")
    assert f"summrl/summrl/r1/checkpoints/0001{COMPLETE}" in keys(s3_endpoint, "interrupted")
    assert f"summrl/summrl/r1/checkpoints/0002{COMPLETE}" not in keys(s3_endpoint, "interrupted")

    shutil.rmtree(tmp_path / "run")
    fresh = CheckpointBackup.open(config)
    assert fresh.complete_steps() == [1]
    assert fresh.restore() == 1
    restored = fresh.local / "checkpoints"
    assert sorted(p.name for p in restored.iterdir()) == ["0001"]
    assert (restored / "0001" / "adapter_model.safetensors").read_bytes() == b"step one weights" * 100
    # A run that has a local checkpoint keeps it: nothing is downloaded over it.
    assert fresh.restore() is None



def test_a_folder_behind_its_backup_is_refused_not_trained_again_over_it(tmp_path, s3_endpoint, aws_env):
    """Another folder (another machine) of the run went on to step 2 and backed it up; this one, at step 1, went on
    from its own step 1: it trained step 2 again, replaced its backup, and the record lost the other's attempt
    (found by an audit). A folder behind its backup is now refused, naming both steps and the way out."""
    from summrl.errors import ConfigError

    ahead = storage_config(tmp_path / "ahead", s3_endpoint, "behind")
    backup = CheckpointBackup.open(ahead)
    for step in (1, 2):
        write_checkpoint(ahead, step, f"step {step}".encode() * 100)
        asyncio.run(backup.after_step(step))
    behind = storage_config(tmp_path / "behind", s3_endpoint, "behind")
    write_checkpoint(behind, 1, b"step 1" * 100)
    with pytest.raises(ConfigError, match=r"^run.name=r1: s3://behind/summrl/summrl/r1 holds step 2, past this "
                                          r"folder's latest checkpoint \(step 1\): .*\(hydra.run.dir=<new folder>\) to "
                                          r"restore step 2, or set storage.restore=false"):
        CheckpointBackup.open(behind).restore()
    assert CheckpointBackup.open(storage_config(tmp_path / "behind", s3_endpoint, "behind",
                                                "storage.restore=false")).restore() is None  # goes on from step 1
    assert CheckpointBackup.open(ahead).restore() is None  # a folder at its backup's step goes on as before


def test_a_machine_lost_while_a_checkpoint_goes_up_keeps_every_trained_steps_history_row_once(tmp_path, s3_endpoint,
                                                                                              aws_env, monkeypatch):
    """The checkpoint went up before the history: a machine lost in between left checkpoint 2 complete and history
    without step 2's row (a preemption test saw steps [1, 3, 4] trained). Now the history goes first, and a restore
    keeps its rows up to the checkpoint it finds (the later steps are trained again, with their rows)."""
    config = storage_config(tmp_path, s3_endpoint, "lost")
    backup = CheckpointBackup.open(config)
    history = backup.local / "history.jsonl"

    def trained(step: int) -> None:
        write_checkpoint(config, step, f"weights {step}".encode())
        with history.open("a") as f:
            f.write(json.dumps({"training_step": step, "train/reward": 0.5}) + "\n")

    trained(1)
    asyncio.run(backup.after_step(1))
    trained(2)
    monkeypatch.setattr(CheckpointBackup, "_upload_checkpoint", lambda self, step: (_ for _ in ()).throw(
        ConnectionError("the machine is gone")))
    asyncio.run(backup.after_step(2))  # the history went up; checkpoint 2 did not
    stored = s3(s3_endpoint).get_object(Bucket="lost", Key=f"{backup.root}/history.jsonl")["Body"].read().decode()
    assert [json.loads(line)["training_step"] for line in stored.splitlines()] == [1, 2]

    shutil.rmtree(tmp_path / "run")  # a fresh machine
    fresh = CheckpointBackup.open(config)
    assert fresh.restore() == 1
    restored = [json.loads(line)["training_step"] for line in (fresh.local / "history.jsonl").read_text().splitlines()]
    assert restored == [1]  # step 2 is trained again: its row will be written once, then


def test_a_backup_that_does_not_match_its_manifest_is_refused_and_restore_false_starts_afresh(tmp_path, s3_endpoint,
                                                                                             aws_env):
    """Neither the manifest check of a download nor storage.restore=false was exercised by any test."""
    config = storage_config(tmp_path, s3_endpoint, "mismatch")
    backup = CheckpointBackup.open(config)
    write_checkpoint(config, 1, b"step one weights" * 100)
    asyncio.run(backup.after_step(1))
    (tmp_path / "run" / "result.json").write_text(json.dumps({"status": "running", "steps": 1, "val_history": []}))
    backup.save_result(str(tmp_path / "run"))
    s3(s3_endpoint).put_object(Bucket="mismatch", Key="summrl/summrl/r1/sft/samples.jsonl", Body=b'{"doc": "earlier"}')
    shutil.rmtree(tmp_path / "run")
    manifest = json.loads(s3(s3_endpoint).get_object(Bucket="mismatch",
                                                     Key="summrl/summrl/r1/checkpoints/0001.complete")["Body"].read())

    # storage.restore=false: the backup is there, and a fresh machine starts afresh without reading it
    afresh = CheckpointBackup.open(storage_config(tmp_path, s3_endpoint, "mismatch", "storage.restore=false"))
    assert afresh.complete_steps() == [1]
    assert afresh.restore_result(str(tmp_path / "run")) is None and afresh.restore() is None
    assert not (afresh.local / "checkpoints").exists() and not (tmp_path / "run" / "result.json").exists()
    # ... and its backups with it: the earlier run's markers are gone, so that a later resume (restore=true, an empty
    # machine) can't load the earlier run's step 1 with this run's history (found by an audit)
    assert afresh.complete_steps() == []
    # its record and SFT samples too: a resume of this run killed before its first backup adopted the earlier run's
    # val scores as its own and restored its samples (found by an audit)
    assert fetch_result(config) is None and fetch_file(config, "sft/samples.jsonl") is None
    s3(s3_endpoint).put_object(Bucket="mismatch", Key="summrl/summrl/r1/checkpoints/0001.complete",
                               Body=json.dumps(manifest))  # put back for the manifest check below

    # an object changed after its marker was written (same size, other bytes): refused, nothing half-restored
    s3(s3_endpoint).put_object(Bucket="mismatch", Key="summrl/summrl/r1/checkpoints/0001/optimizer.pt",
                               Body=b"x" * len(b"step one weights" * 100))
    fresh = CheckpointBackup.open(config)
    with pytest.raises(StorageError, match=r"checkpoints/0001/optimizer.pt does not match its manifest \(size or "
                                           r"md5\): delete that step's marker to fall back to the previous one"):
        fresh.restore()
    assert not (fresh.local / "checkpoints" / "0001").exists()


def test_backup_every_n_steps_and_always_the_last(tmp_path, s3_endpoint, aws_env):
    config = storage_config(tmp_path, s3_endpoint, "every", "storage.backup_every=2", "trainer.max_steps=3")
    backup = CheckpointBackup.open(config)
    for step in (1, 2, 3):
        write_checkpoint(config, step, f"weights {step}".encode())
        asyncio.run(backup.after_step(step))
    assert CheckpointBackup.open(config).complete_steps() == [2, 3]
    manifest = json.loads(s3(s3_endpoint).get_object(
        Bucket="every", Key=f"summrl/summrl/r1/checkpoints/0002{COMPLETE}")["Body"].read())
    assert manifest["files"]["adapter_model.safetensors"]["size"] == len(b"weights 2")


def test_a_last_checkpoint_that_does_not_go_up_is_said_not_passed_over(tmp_path, s3_endpoint, aws_env, monkeypatch):
    """The last step has no next backup to try again: its failed upload was a warning, the run completed with exit 0,
    and a managed job or down_after_run then deleted the machine holding the only copy. ``after_step`` now says so
    (the loop fails the run with an S3 error naming the folder), and a later call backs it up."""
    config = storage_config(tmp_path, s3_endpoint, "last", "trainer.max_steps=2")
    backup = CheckpointBackup.open(config)
    for step in (1, 2):
        write_checkpoint(config, step, f"weights {step}".encode())
    assert asyncio.run(backup.after_step(1))
    real = backup._upload_checkpoint

    def down(step):
        raise ConnectionResetError("the network dropped")

    monkeypatch.setattr(backup, "_upload_checkpoint", down)
    assert not asyncio.run(backup.after_step(2)) and not asyncio.run(backup.after_step(2, final=True))
    assert backup.complete_steps() == [1]
    monkeypatch.setattr(backup, "_upload_checkpoint", real)  # S3 answers again: the rerun's final backup
    assert asyncio.run(backup.after_step(2, final=True)) and backup.complete_steps() == [1, 2]


@pytest.mark.slow
def test_embedded_run_backs_up_each_step_and_resumes_from_s3(shared_run):
    """The shared run (conftest.shared_run) backs up both steps; with its run folder gone, the rerun resumes at step 2
    from S3, with the val scores and history its first invocation recorded."""
    endpoint, first, second = shared_run.endpoint, shared_run.first, shared_run.second
    prefix = "summrl/summrl/shared/"
    stored = keys(endpoint, "shared", prefix)
    assert {f"{prefix}checkpoints/000{s}{COMPLETE}" for s in (1, 2, 3)} <= set(stored)
    assert f"{prefix}history.jsonl" in stored
    assert "step 1 backed up" in first.stdout and "step 2 backed up" in first.stdout

    assert "restored step 2 from s3://shared/summrl/summrl/shared" in second.stdout
    assert "resuming at step 2 of 3" in second.stdout
    result = shared_run.result()
    assert result["status"] == "completed" and result["steps"] == 3
    # the run's judge spend: the first invocation's calls too (the resumed one recorded only its own)
    earlier = shared_run.after_first["result"]
    assert earlier["judge_calls"] > 0 and result["judge_calls"] > earlier["judge_calls"]
    assert result["judge_cost_usd"] >= earlier["judge_cost_usd"]
    stored_result = s3(endpoint).get_object(Bucket="shared", Key=f"{prefix}result.json")
    assert json.loads(stored_result["Body"].read()) == result
    # The restored history carries step 1 and 2's training rows into the resumed run's history.
    rows = shared_run.history()
    assert [r.get("step") for r in rows if any(k.startswith("train/") for k in r)] == [1, 2, 3]  # none twice


def test_restore_brings_back_the_run_record_only_into_an_empty_run_folder(tmp_path, s3_endpoint, aws_env):
    config = storage_config(tmp_path, s3_endpoint, "records")
    backup = CheckpointBackup.open(config)
    run_dir = tmp_path / "run"
    assert backup.restore_result(str(run_dir)) is None  # nothing backed up yet
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps({"status": "completed", "steps": 2, "val_history": []}))
    backup.save_result(str(run_dir))
    assert backup.restore_result(str(run_dir)) is None  # a local record wins: nothing downloaded
    (run_dir / "result.json").unlink()
    assert backup.restore_result(str(run_dir)) == {"status": "completed", "steps": 2, "val_history": []}
    assert json.loads((run_dir / "result.json").read_text())["steps"] == 2
    # one a crash cut short counts as none: the backed-up one replaces it (it stopped every later run, unreadable)
    (run_dir / "result.json").write_text('{"status": "runn')
    assert backup.restore_result(str(run_dir))["steps"] == 2
    assert [p.name for p in run_dir.iterdir()] == ["result.json"]  # written whole, through a renamed temporary file


def backed_up_run(config, run_dir, **fields) -> dict:
    """A run's record backed up as its earlier invocations left it (2 steps trained, one val pass), with no local
    copy: a fresh machine's view."""
    from summrl.job import JobInfo, write_result
    from summrl.tracking import flat_config

    record = {"status": "interrupted", "config": flat_config(config, JobInfo()), "seed": config.seed, "steps": 2,
              "judge_cost_usd": 41.5, "attempts": [{"attempt": 1, "start_step": 0, "end_step": 2}],
              "val_history": [{"step": 0, "val_reward": 0.3}], **fields}
    write_result(run_dir, record)
    CheckpointBackup.open(config).save_result(str(run_dir))
    shutil.rmtree(run_dir)
    return fetch_result(config)


def test_a_fresh_machine_that_cannot_read_the_backed_up_record_leaves_it_as_it_was(tmp_path, s3_endpoint, aws_env,
                                                                                   monkeypatch):
    """A fresh machine whose download of result.json failed (a timeout, a signal during the call) uploaded its own
    record, which knew nothing of the earlier invocations, over the backed-up one: the run's val scores, attempts and
    judge spend were gone for good, and the next recovery adopted the empty record."""
    from botocore.exceptions import ReadTimeoutError

    from summrl.job import RunRecord
    from summrl.loop import train

    config = storage_config(tmp_path, s3_endpoint, "unread")
    earlier = backed_up_run(config, tmp_path / "run")
    read = CheckpointBackup._get

    def timing_out(self, rel, missing_ok=False):  # S3 answers every call but the record's download
        if rel == "result.json":
            raise ReadTimeoutError(endpoint_url=s3_endpoint)
        return read(self, rel, missing_ok)

    monkeypatch.setattr(CheckpointBackup, "_get", timing_out)
    with pytest.raises(ReadTimeoutError):
        asyncio.run(train(config, RunRecord(config.run.dir)))
    monkeypatch.undo()
    assert fetch_result(config) == earlier


@pytest.mark.parametrize("lost_at", [1, 2])
def test_a_val_pass_is_backed_up_with_its_rows_and_a_fresh_machine_does_not_pay_for_it_again(lost_at, tmp_path,
                                                                                            s3_endpoint, aws_env,
                                                                                            tiny_weights, monkeypatch):
    """A val pass went up with the next step's backup: a machine lost before it ran and paid for the pass again on
    the next one (the step-0 pass too, before any backup: stop 73's known list). Backed up at once, its rows go up with
    it: a fresh machine that skips the pass keeps them in history.jsonl (ART's and W&B's record)."""
    import summrl.loop
    from summrl.job import RunRecord
    from summrl.loop import history_path, train

    class Lost(BaseException):  # the machine, gone as a step starts: nothing of this process runs after it
        pass

    small = ["trainer.max_steps=2", "trainer.eval_every=1", "dataset.val_size=1", "trainer.val_rollouts_per_doc=1",
             "trainer.max_summary_tokens=4", tiny_weights]
    config = storage_config(tmp_path, s3_endpoint, f"val{lost_at}", *small)
    passes, steps = [], []
    step, evaluate = summrl.loop.train_step, summrl.loop.evaluate

    async def lost(session, documents, at):
        steps.append(at)
        if len(steps) == lost_at:
            raise Lost
        return await step(session, documents, at)

    async def counted(session, val, at):
        passes.append(at)
        return await evaluate(session, val, at)

    monkeypatch.setattr(summrl.loop, "evaluate", counted)
    monkeypatch.setattr(summrl.loop, "train_step", lost)
    with pytest.raises(Lost):
        asyncio.run(train(config, RunRecord(config.run.dir)))
    scored = list(range(lost_at))  # the passes before the lost step: 0, or 0 and 1
    assert passes == scored and [h["step"] for h in fetch_result(config)["val_history"]] == scored
    monkeypatch.setattr(summrl.loop, "train_step", step)
    fresh = storage_config(tmp_path / "fresh", s3_endpoint, f"val{lost_at}", *small)
    assert asyncio.run(train(fresh, RunRecord(fresh.run.dir))) is not None
    assert passes == [*scored, *range(lost_at, 3)]  # each pass once
    assert [h["step"] for h in fetch_result(fresh)["val_history"]] == [0, 1, 2]
    rows = [json.loads(line) for line in history_path(fresh).read_text().splitlines()]
    assert sorted(r["training_step"] for r in rows if "val/reward" in r) == [0, 1, 2]


def test_a_fresh_machine_refuses_a_resume_with_other_settings_as_the_machine_that_trained_it_does(
        tmp_path, s3_endpoint, aws_env):
    """The settings check ran before the backed-up record was adopted, so on a fresh machine it had nothing to
    compare with: a resume with another seed and reward loaded the run's checkpoints and mixed the two runs' scores."""
    from summrl.errors import ConfigError
    from summrl.job import RunRecord
    from summrl.loop import train

    config = storage_config(tmp_path, s3_endpoint, "settings")
    earlier = backed_up_run(config, tmp_path / "run")
    other = storage_config(tmp_path, s3_endpoint, "settings", f"seed={config.seed + 1}")
    with pytest.raises(ConfigError, match=rf"run.name=r1 resumes a run trained with seed={config.seed} \(now "
                                          rf"{config.seed + 1}\)"):
        asyncio.run(train(other, RunRecord(other.run.dir)))
    backed_up = fetch_result(config)
    assert backed_up["config"] == earlier["config"] and backed_up["val_history"] == earlier["val_history"]
    assert not (CheckpointBackup.open(config).local / "checkpoints").exists()  # nothing restored, no model loaded


def test_sft_files_are_restored_whole_or_not_at_all(tmp_path, s3_endpoint, aws_env, monkeypatch):
    """A crash part-way through restoring sft/ left some files, which stopped every later restore; the next upload
    then put those partial files over the whole ones (the teacher's paid summaries lost)."""
    config = storage_config(tmp_path, s3_endpoint, "sftrestore", "sft=best_of_n")
    backup = CheckpointBackup.open(config)
    backup.sft_local.mkdir(parents=True)
    for name in ("collected.jsonl", "samples.jsonl", "summaries.jsonl"):
        (backup.sft_local / name).write_text(f'{{"file": "{name}"}}\n')
    backup._upload_sft(sft_files(backup.sft_local))
    shutil.rmtree(tmp_path / "run")
    fresh = CheckpointBackup.open(config)
    real_get, calls = fresh._get, []

    def dies_on_the_third(key, **kwargs):
        calls.append(key)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the machine goes away mid-restore
        return real_get(key, **kwargs)

    monkeypatch.setattr(fresh, "_get", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        fresh._restore_sft()
    assert not fresh.sft_local.exists()  # nothing half-restored where the next run looks
    monkeypatch.setattr(fresh, "_get", real_get)
    fresh._restore_sft()
    assert sorted(p.name for p in fresh.sft_local.iterdir()) == ["collected.jsonl", "samples.jsonl", "summaries.jsonl"]


def test_the_kl_reference_checkpoint_is_backed_up_off_schedule_and_restored_with_the_latest(
        tmp_path, s3_endpoint, aws_env, caplog):
    """A managed job recovered on a fresh machine needs its KL reference at its next step: before, only the latest
    checkpoint came back (and the reference went up only if backup_every happened to reach it)."""
    caplog.set_level(logging.INFO, logger="summrl")
    config = storage_config(tmp_path, s3_endpoint, "klref", "algorithm=grpo_kl",
                            "algorithm.kl_penalty_reference_step=2", "storage.backup_every=4", "trainer.max_steps=6")
    backup = CheckpointBackup.open(config)
    for step in range(1, 6):
        write_checkpoint(config, step, f"weights {step}".encode())
        asyncio.run(backup.after_step(step))
    assert backup.complete_steps() == [2, 4]  # 2: the reference, off backup_every's schedule

    shutil.rmtree(tmp_path / "run")  # the machine is gone
    fresh = CheckpointBackup.open(config)
    assert fresh.restore() == 4
    checkpoints = fresh.local / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0002", "0004"]
    assert (checkpoints / "0002" / "adapter_model.safetensors").read_bytes() == b"weights 2"
    assert "restored step 2, the KL reference" in said(caplog, logging.INFO)

    # A restore cut short after the latest: the next invocation fetches the reference alone.
    shutil.rmtree(checkpoints / "0002")
    assert CheckpointBackup.open(config).restore() is None
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0002", "0004"]

    # Without a KL penalty (or against the base model), the reference is not fetched.
    shutil.rmtree(tmp_path / "run")
    plain = storage_config(tmp_path, s3_endpoint, "klref", "storage.backup_every=4", "trainer.max_steps=6")
    assert CheckpointBackup.open(plain).restore() == 4
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0004"]


def test_a_kl_reference_missing_from_the_backup_is_named_before_the_model_loads(tmp_path, s3_endpoint, aws_env):
    config = storage_config(tmp_path, s3_endpoint, "klold", "storage.backup_every=2", "trainer.max_steps=4")
    backup = CheckpointBackup.open(config)  # a run backed up without the reference (as before this change)
    for step in (1, 2):
        write_checkpoint(config, step, f"weights {step}".encode())
        asyncio.run(backup.after_step(step))
    shutil.rmtree(tmp_path / "run")
    kl = storage_config(tmp_path, s3_endpoint, "klold", "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=1",
                        "storage.backup_every=2", "trainer.max_steps=4")
    with pytest.raises(StorageError, match=r"kl_penalty_reference_step=1: .*checkpoint 1.*"
                                           r"kl_penalty_reference_step=null"):
        CheckpointBackup.open(kl).restore()


def test_the_sft_checkpoint_is_backed_up_off_schedule_and_a_failed_upload_of_it_is_tried_again(
        tmp_path, s3_endpoint, aws_env, monkeypatch):
    """With backup_every > 1 step 1 (SFT's) never went up, or went up once and failed for good: a fresh machine
    dropped sft/record.json, trained SFT again on a GRPO checkpoint, then every GRPO step again."""
    config = storage_config(tmp_path, s3_endpoint, "sftkept", "sft=best_of_n", "storage.backup_every=4",
                            "trainer.max_steps=8")
    backup = CheckpointBackup.open(config)
    real, calls = backup._upload_checkpoint, []

    def fails_once(step):
        calls.append(step)
        if len(calls) == 1:
            raise ConnectionResetError("the network dropped")
        real(step)

    monkeypatch.setattr(backup, "_upload_checkpoint", fails_once)
    for step in range(1, 5):
        write_checkpoint(config, step, f"weights {step}".encode())
        asyncio.run(backup.after_step(step))
    assert calls == [1, 1, 4] and backup.complete_steps() == [1, 4]  # step 1 again with step 4's backup
    # a record of SFT counts with any complete checkpoint from its step on
    backup.sft_local.mkdir(parents=True)
    (backup.sft_local / "record.json").write_text(json.dumps({"step": 1}))
    backup._upload_sft(sft_files(backup.sft_local))
    shutil.rmtree(tmp_path / "run")
    fresh = CheckpointBackup.open(config)
    assert fresh.restore() == 4 and json.loads((fresh.sft_local / "record.json").read_text())["step"] == 1


def test_an_object_aws_encrypted_with_kms_is_checked_by_its_size_not_its_etag(tmp_path, s3_endpoint, aws_env):
    """AWS gives an object encrypted with SSE-KMS (a bucket's default encryption, say) an ETag that is not its md5:
    every backup failed its check, leaving a managed job nothing to recover from. moto gives the md5 whatever the
    encryption, so the head here answers as AWS does."""
    from summrl.storage import upload_verified

    client = s3(s3_endpoint)
    client.create_bucket(Bucket="kms")
    real_head = client.head_object

    def aws_head(**kwargs):
        return {**real_head(**kwargs), "ETag": '"9b2cf535f27731c974343645a3985328"', "ServerSideEncryption": "aws:kms"}

    client.head_object = aws_head
    path = tmp_path / "weights"
    path.write_bytes(b"step one weights" * 100)
    assert upload_verified(client, "kms", "kms", path, "run/weights")["size"] == 1600
    client.head_object = lambda **kwargs: {**aws_head(**kwargs), "ContentLength": 1599}  # cut short: still refused
    with pytest.raises(StorageError, match="uploaded object does not match"):
        upload_verified(client, "kms", "kms", path, "run/weights")
    client.head_object = lambda **kwargs: {**real_head(**kwargs), "ETag": '"9b2cf535f27731c974343645a3985328"'}
    with pytest.raises(StorageError, match="uploaded object does not match"):  # unencrypted: the md5 must match
        upload_verified(client, "kms", "kms", path, "run/weights")
