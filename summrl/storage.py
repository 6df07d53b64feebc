"""S3 backup of a run's checkpoints and history, and resume from the latest complete backup (boto3).

Layout, under ``s3://<bucket>/<prefix>/<project>/<run name>/``::

    history.jsonl                      the run's metrics so far
    checkpoints/<step:04d>/<files>     one checkpoint folder, as the backend wrote it
    checkpoints/<step:04d>.complete    written last: the manifest (path -> size, md5) of that folder
    sft/<files>                        sft=: the collected summaries, kept samples, teacher usage, stage record

A checkpoint counts only once its marker exists, so an upload cut short (a crash, a preempted machine)
is never restored. A KL reference checkpoint (``algorithm.kl_penalty_reference_step``) and the SFT checkpoint go up as
soon as they are written, whatever ``backup_every`` says (tried again with the next backup if the upload failed), and
the reference comes back with the latest: a run resumed on a fresh machine needs it at its next step. ``sft/`` goes up during collection (every ``SFT_BACKUP_S``) and before each checkpoint, so a
fresh machine never pays a teacher again; its ``record.json`` (SFT has trained) is restored only with a complete
checkpoint from its step on, else SFT trains again from the restored samples. Credentials come from boto3's usual chain
(AWS_* in the environment or .env); they are never logged or written.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from summrl.config import bucket_problem
from summrl.errors import ConfigError, ExpectedFailure, is_network
from summrl.job import read_result, write_atomic

log = logging.getLogger(__name__)

COMPLETE = ".complete"
SFT_DIR = "sft"  # <run dir>/sft: the SFT stage's files (summrl.sft)
SFT_RECORD = "record.json"  # sft/record.json: the SFT stage has trained, and its checkpoint's step
SFT_BACKUP_S = 60.0  # during collection, sft/ goes up at most this often (and once collection ends)
# Hydra writes .hydra/config.yaml before every invocation starts, a refused one too (other weights, a typo in a
# resume): the config of the last invocation that went on to train is kept apart, for serve, export and benchmark
TRAINED_CONFIG = Path(".hydra") / "trained.yaml"
HYDRA_CONFIG = Path(".hydra") / "config.yaml"


def keep_trained_config(run_dir: Path) -> None:
    """This invocation passed every check and trains: its config (Hydra's, unresolved, so no secret) is the run's."""
    hydra = Path(run_dir) / HYDRA_CONFIG
    if hydra.is_file():
        write_atomic(Path(run_dir) / TRAINED_CONFIG, hydra.read_bytes())


def trained_config(run_dir: Path) -> Path:
    """The config a run folder's checkpoints were trained with: Hydra's for a run from before TRAINED_CONFIG, or one
    trained elsewhere (backend=skypilot)."""
    kept = Path(run_dir) / TRAINED_CONFIG
    return kept if kept.is_file() else Path(run_dir) / HYDRA_CONFIG


class StorageError(ExpectedFailure, RuntimeError):
    """The backup can't be reached or used; the message names the setting and the fix."""

    failure = "s3"


def resolve_bucket(storage: Any) -> Optional[str]:
    """``storage.bucket``, else $BACKUP_BUCKET (from the environment or .env)."""
    return storage.bucket or os.environ.get("BACKUP_BUCKET") or None


def bucket_problems(storage: Any) -> list[str]:
    """The bucket a backup would use, when it is a URL or a path rather than a name (storage.bucket is checked as the
    config is typed; $BACKUP_BUCKET only here, before anything runs)."""
    bucket = resolve_bucket(storage) if storage.enabled else None
    problem = bucket_problem(bucket, "storage.bucket" if storage.bucket else "$BACKUP_BUCKET")
    return [problem] if problem else []


def bucket_label(storage: Any) -> str:
    """How messages name the bucket: a name from $BACKUP_BUCKET travels as a secret, so it is not echoed."""
    return storage.bucket or "$BACKUP_BUCKET"


def model_dir(config: Any) -> Path:
    """Where the backend keeps this run's ART state (ART's layout: <art path>/<project>/models/<name>)."""
    return Path(config.run.dir) / "art" / config.project / "models" / config.run.name


def sft_dir(config: Any) -> Path:
    """Where the SFT stage keeps its samples and record (summrl.sft)."""
    return Path(config.run.dir) / SFT_DIR


def sft_files(folder: Path) -> list[Path]:
    """The SFT files to back up, in an order that keeps the backup consistent when read back: summaries before the
    samples kept from them, samples before the documents marked done, the record last."""
    order = {"summaries.jsonl": 0, "samples.jsonl": 1, "collected.jsonl": 2, SFT_RECORD: 9}
    files = [p for p in folder.glob("*") if p.is_file() and not p.name.endswith(".tmp")] if folder.is_dir() else []
    return sorted(files, key=lambda p: (order.get(p.name, 5), p.name))


def local_steps(checkpoints: Path) -> list[int]:
    return sorted(int(p.name) for p in checkpoints.glob("*") if p.is_dir() and p.name.isdigit())


def latest_local_step(config: Any) -> int:
    """The run's latest checkpoint on this machine (0: none), read without ART's get_step_from_dir, which makes the
    folder: the step it resumes from once S3 has restored what it holds."""
    return max(local_steps(model_dir(config) / "checkpoints"), default=0)


def _describe(e: Exception, bucket: str, label: str) -> str:
    """An S3 error for a message, with the bucket named as ``label`` (URLs in boto errors carry its name)."""
    return f"{type(e).__name__}: {e}".replace(bucket, label)


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _s3_client(storage: Any) -> Any:
    import boto3
    from botocore.config import Config as BotoConfig

    # Path-style addressing: MinIO and most S3-compatible stores need it; AWS accepts it.
    style = {"s3": {"addressing_style": "path"}} if storage.endpoint_url else {}
    return boto3.client("s3", endpoint_url=storage.endpoint_url, region_name=storage.region,
                        config=BotoConfig(retries={"max_attempts": 5, "mode": "standard"}, **style))


@dataclass
class CheckpointBackup:
    """Backs up one run. ``NoBackup`` stands in when ``storage.enabled`` is false."""

    client: Any
    bucket: str
    label: str  # the bucket as messages name it (bucket_label)
    root: str  # <prefix>/<project>/<run name>
    local: Path  # the run's ART model dir
    every: int
    max_steps: int
    sft_local: Optional[Path] = None  # the run's sft/ folder
    restore_enabled: bool = True
    reference: Optional[int] = None  # the KL reference checkpoint's step (algorithm.kl_penalty_reference_step), if any
    sft_step: Optional[int] = None  # sft=: the SFT checkpoint's step (1), backed up whatever backup_every says
    uploaded: set[int] = field(default_factory=set)
    sft_uploaded: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (size, mtime) last uploaded
    sft_backed_up_at: float = 0.0
    # The backed-up result.json could not be read (a timeout, a refused GetObject, a signal during the call): this
    # invocation's record knows nothing of the earlier invocations, so it must not replace the backed-up one.
    result_unread: bool = False

    @classmethod
    def open(cls, config: Any) -> "CheckpointBackup | NoBackup":
        """Check the bucket now (creating it if configured), before any model loads."""
        storage = config.storage
        if not storage.enabled:
            return NoBackup()
        bucket = resolve_bucket(storage)
        if not bucket:
            raise StorageError("storage.enabled=true needs a bucket: set BACKUP_BUCKET in the environment or .env, "
                               "or storage.bucket=<name>; or turn backups off with storage.enabled=false")
        client = _s3_client(storage)
        _ensure_bucket(client, bucket, bucket_label(storage), storage)
        root = "/".join(p for p in (storage.prefix, config.project, config.run.name) if p)
        return cls(client=client, bucket=bucket, label=bucket_label(storage), root=root, local=model_dir(config),
                   every=storage.backup_every, max_steps=config.trainer.max_steps, sft_local=sft_dir(config),
                   restore_enabled=storage.restore, reference=reference_step(config),
                   sft_step=1 if config.sft.kind != "none" else None)

    @property
    def url(self) -> str:
        return f"s3://{self.label}/{self.root}"

    # ------------------------------------------------------------------ restore

    def complete_steps(self) -> list[int]:
        """Steps whose upload finished (their marker exists), oldest first."""
        prefix = f"{self.root}/checkpoints/"
        steps = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                          Delimiter="/"):
            for obj in page.get("Contents", []):
                name = obj["Key"][len(prefix):]
                if name.endswith(COMPLETE) and name[: -len(COMPLETE)].isdigit():
                    steps.append(int(name[: -len(COMPLETE)]))
        return sorted(steps)

    def restore(self) -> Optional[int]:
        """With no local checkpoint, download the latest complete backup; the backend then resumes at its step.
        The KL reference checkpoint, if the run has one before its latest step and lacks it, comes too. With no
        local sft/ folder, download the backed-up one (a collection continues without paying again)."""
        if not self.restore_enabled:
            self._forget_earlier()
            return None
        self._restore_sft()
        local = local_steps(self.local / "checkpoints")
        steps = self.complete_steps()
        if local:
            if steps and steps[-1] > max(local):
                # the run went on elsewhere (another machine, another folder of this run.name): going on from here
                # trained those steps again and replaced their backup and record, the other invocation's lost
                name = self.root.rsplit("/", 1)[-1]
                raise ConfigError(
                    f"run.name={name}: {self.url} holds step {steps[-1]}, past this folder's latest "
                    f"checkpoint (step {max(local)}): the run went on elsewhere. Resume it in an empty folder "
                    f"(hydra.run.dir=<new folder>) to restore step {steps[-1]}, or set storage.restore=false to go on "
                    f"from step {max(local)} here, replacing the backup past it")
            self._restore_reference(max(local))  # (a restore cut short between the latest and the reference)
            return None
        step = steps[-1] if steps else 0  # none: the step-0 val pass's rows, if it went up (``after_val``)
        history = self._get("history.jsonl", missing_ok=True)  # before the checkpoint: restore ends once it is there
        if history is not None and not (self.local / "history.jsonl").exists():
            write_atomic(self.local / "history.jsonl", history_through(history, step))
        if not steps:
            return None
        self._download(step)
        log.info(f"summrl: restored step {step} from {self.url}")
        self._restore_reference(step, steps)
        return step

    def _forget_earlier(self) -> None:
        """storage.restore=false on a run with no local checkpoint starts afresh, and so does its backup: the earlier
        run's completion markers under this name go. Kept, they mixed the two runs: a later resume on an empty
        machine loaded the earlier run's latest step (past this run's) with this run's history, and the earlier
        run's kept steps (SFT, the KL reference) counted as this run's, never uploaded. Their checkpoint files stay
        until this run's backups replace them."""
        if local_steps(self.local / "checkpoints"):
            return
        steps = self.complete_steps()
        for step in steps:
            self.client.delete_object(Bucket=self.bucket, Key=f"{self.root}/checkpoints/{step:04d}{COMPLETE}")
        # its record, history and SFT samples too, markers or not: a resume of this run killed before its first
        # backup adopted the earlier run's record (its val scores counted as this run's) and restored its samples
        prefix = f"{self.root}/sft/"
        records = [obj["Key"] for page in self.client.get_paginator("list_objects_v2").paginate(
                       Bucket=self.bucket, Prefix=prefix) for obj in page.get("Contents", [])]
        for name in ("result.json", "history.jsonl"):
            if self._get(name, missing_ok=True) is not None:
                records.append(f"{self.root}/{name}")
        for key in records:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        if steps or records:
            log.info(f"summrl: storage.restore=false: starting afresh; the earlier run's backups under {self.url} "
                     f"(steps {', '.join(map(str, steps)) or 'none'}) are no longer marked complete, and its "
                     "result.json, history and SFT samples are deleted, so no resume loads them")

    def _restore_reference(self, latest: int, backed_up: Optional[list[int]] = None) -> None:
        """The KL reference checkpoint, when the run has passed it and it is not on disk."""
        reference = self.reference
        if not reference or reference >= latest or reference in local_steps(self.local / "checkpoints"):
            return
        backed_up = self.complete_steps() if backed_up is None else backed_up
        if reference not in backed_up:
            raise StorageError(
                f"algorithm.kl_penalty_reference_step={reference}: the run is at step {latest}, but neither this "
                f"machine nor {self.url} (steps {backed_up}) has checkpoint {reference}, the KL reference of the next "
                "step (runs made before summrl backed the reference up whatever storage.backup_every said lack it): "
                f"resume where checkpoint {reference} is on disk, or set algorithm.kl_penalty_reference_step=null "
                "to measure the penalty against the base model")
        self._download(reference)
        log.info(f"summrl: restored step {reference}, the KL reference, from {self.url}")

    def _download(self, step: int) -> None:
        """Checkpoint ``step`` into its folder, checked against its manifest; the folder appears only once whole."""
        manifest = json.loads(self._get(f"checkpoints/{step:04d}{COMPLETE}"))
        target = self.local / "checkpoints" / f"{step:04d}"
        partial = self.local / f".restoring-{step:04d}"
        shutil.rmtree(partial, ignore_errors=True)  # a download cut short before
        for rel, meta in manifest["files"].items():
            path = partial / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.bucket, f"{self.root}/checkpoints/{step:04d}/{rel}", str(path))
            if path.stat().st_size != meta["size"] or _md5(path) != meta["md5"]:
                raise StorageError(f"{self.url}/checkpoints/{step:04d}/{rel} does not match its manifest "
                                   "(size or md5): delete that step's marker to fall back to the previous one")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(target)
        self.uploaded.add(step)

    def restore_result(self, run_dir: str) -> Optional[dict]:
        """With no local result.json, the backed-up one: a fresh machine keeps the val scores (and wall time) its
        earlier invocations recorded, as a local rerun does. Returns the record, or None."""
        if not self.restore_enabled or read_result(run_dir) is not None:
            return None
        try:
            data = self._get("result.json", missing_ok=True)
        except BaseException:
            self.result_unread = True
            raise
        if data is None:
            return None
        write_atomic(Path(run_dir) / "result.json", data)
        return json.loads(data)

    def _restore_sft(self) -> None:
        if self.sft_local is None or sft_files(self.sft_local):
            return
        prefix = f"{self.root}/sft/"
        names = [obj["Key"][len(prefix):]
                 for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
                 for obj in page.get("Contents", [])]
        restored = []
        # into a folder of its own, renamed into place once every file is there: a crash part-way left some files,
        # which stopped the next restore, and the upload after it put the partial files over the whole ones
        partial = self.sft_local.with_name(f".restoring-{self.sft_local.name}")
        shutil.rmtree(partial, ignore_errors=True)
        for name in names:
            if "/" in name:
                continue
            body = self._get(f"sft/{name}")
            if name == SFT_RECORD and not any(s >= (json.loads(body).get("step") or 0) for s in self.complete_steps()):
                continue  # SFT trained, but no checkpoint from it on finished uploading: it trains again
            write_atomic(partial / name, body)
            restored.append(name)
        if restored:
            shutil.rmtree(self.sft_local, ignore_errors=True)  # empty (no sft_files), or not there
            partial.rename(self.sft_local)
            log.info(f"summrl: restored sft/ ({', '.join(sorted(restored))}) from {self.url}")

    # ------------------------------------------------------------------ backup

    async def save_sft(self, *, force: bool = False) -> None:
        """Back up sft/ during collection: at most every SFT_BACKUP_S seconds, or now (``force``). The files are
        copied first, between two appends, so the upload (in a thread) sends a consistent snapshot."""
        if self.sft_local is None or not (force or time.monotonic() - self.sft_backed_up_at >= SFT_BACKUP_S):
            return
        self.sft_backed_up_at = time.monotonic()
        with tempfile.TemporaryDirectory() as snapshot:
            files = [Path(shutil.copy2(p, Path(snapshot) / p.name)) for p in sft_files(self.sft_local)]
            try:
                await asyncio.to_thread(self._upload_sft, files)
            except Exception as e:  # the next backup tries again; collection goes on
                log.warning(f"summrl: warning: backup of sft/ to {self.url} failed ({_describe(e, self.bucket, self.label)})")

    def _upload_sft(self, files: list[Path]) -> None:
        """Upload the SFT files that changed since the last upload, in sft_files' order."""
        for path in files:
            stat = path.stat()
            if self.sft_uploaded.get(path.name) == (stat.st_size, stat.st_mtime_ns):
                continue
            self._upload(path, f"{self.root}/sft/{path.name}")
            self.sft_uploaded[path.name] = (stat.st_size, stat.st_mtime_ns)

    async def after_step(self, step: int, *, final: bool = False) -> bool:
        """Back up ``step`` every ``backup_every`` steps, at the end, and when it is the KL reference; history goes
        up each time. False: a backup was due and failed (warned; the next one tries again)."""
        if step <= 0 or not (final or step % self.every == 0 or step >= self.max_steps or step in self.kept_steps()):
            return True
        return await asyncio.to_thread(self._backup, step)

    def kept_steps(self) -> set[int]:
        """Steps a resumed run needs whatever backup_every says: the KL reference, and the SFT checkpoint (without it a
        fresh machine trained SFT again on a GRPO checkpoint, then every GRPO step again)."""
        return {s for s in (self.reference, self.sft_step) if s}

    def _backup(self, step: int) -> bool:
        try:
            if self.sft_local is not None:  # before the checkpoint: a record.json counts only with its checkpoint
                self._upload_sft(sft_files(self.sft_local))
            # the history first: a machine lost while the checkpoint goes up leaves its rows, which the restore trims
            # to the checkpoint it finds (checkpoint first, the step's training row was lost with the machine)
            history = self.local / "history.jsonl"
            if history.exists():
                self._upload(history, f"{self.root}/history.jsonl")
            # this step, and a kept step whose upload failed before (it was never tried again)
            missing = [s for s in sorted(self.kept_steps()) if s < step and s not in self.uploaded]
            if missing:  # (an earlier invocation's upload counts: asked once, then remembered)
                self.uploaded.update(set(missing) & set(self.complete_steps()))
            for due in sorted({s for s in missing if s not in self.uploaded} | {step}):
                if due not in self.uploaded and (self.local / "checkpoints" / f"{due:04d}").is_dir():
                    self._upload_checkpoint(due)
                    self.uploaded.add(due)
            return True
        except Exception as e:  # a failed backup must not end a paid run: the next one retries
            log.warning(f"summrl: warning: backup of step {step} to {self.url} failed "
                        f"({_describe(e, self.bucket, self.label)}); training goes on and the next backup tries again")
            return False

    def after_val(self, run_dir: str) -> None:
        """After a val pass: the history, then result.json, so that a fresh machine neither scores the pass again
        nor lacks its rows (the restore keeps them with the checkpoint of their step; with none, those of step 0)."""
        history = self.local / "history.jsonl"
        try:
            if history.exists():
                self._upload(history, f"{self.root}/history.jsonl")
        except Exception as e:  # result.json stays as it was: the pass is scored again there, its rows with it
            log.warning(f"summrl: warning: upload of history.jsonl to {self.url} failed "
                        f"({_describe(e, self.bucket, self.label)})")
            return
        self.save_result(run_dir)

    def save_result(self, run_dir: str) -> None:
        """Upload result.json (status, val scores), so that the launcher of a remote run can read it."""
        path = Path(run_dir) / "result.json"
        if self.result_unread:  # it went up over the run's backed-up record with its val scores and spend
            log.warning(f"summrl: warning: result.json not uploaded to {self.url}: the one backed up there could not "
                        "be read first, and this invocation's record lacks what it holds")
            return
        try:
            if path.exists():
                self._upload(path, f"{self.root}/result.json")
        except Exception as e:
            log.warning(f"summrl: warning: upload of result.json to {self.url} failed "
                        f"({_describe(e, self.bucket, self.label)})")

    def _upload_checkpoint(self, step: int) -> None:
        folder = self.local / "checkpoints" / f"{step:04d}"
        files = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            files[rel] = self._upload(path, f"{self.root}/checkpoints/{step:04d}/{rel}")
        # Last: the marker that makes this checkpoint count.
        body = json.dumps({"step": step, "files": files}, indent=1).encode()
        self.client.put_object(Bucket=self.bucket, Key=f"{self.root}/checkpoints/{step:04d}{COMPLETE}", Body=body)
        log.info(f"summrl: step {step} backed up to {self.url}")

    def _upload(self, path: Path, key: str) -> dict:
        return upload_verified(self.client, self.bucket, self.label, path, key)

    def _get(self, rel: str, missing_ok: bool = False) -> Optional[bytes]:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=f"{self.root}/{rel}")["Body"].read()
        except self.client.exceptions.NoSuchKey:
            if missing_ok:
                return None
            raise


class NoBackup:
    """storage.enabled=false: nothing is backed up or restored."""

    def restore(self) -> None:
        return None

    def restore_result(self, run_dir: str) -> None:
        return None

    async def after_step(self, step: int, *, final: bool = False) -> bool:
        return True

    def save_result(self, run_dir: str) -> None:
        return None

    def after_val(self, run_dir: str) -> None:
        return None

    async def save_sft(self, *, force: bool = False) -> None:
        return None


def history_through(history: bytes, step: int) -> bytes:
    """The history's rows up to ``step`` (ART's ``training_step``): the resumed run trains the later steps again, and
    their rows again with them. A cut row is dropped."""
    kept = []
    for line in history.decode("utf-8", "replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("training_step", 0) <= step:
            kept.append(line + "\n")
    return "".join(kept).encode()


def reference_step(config: Any) -> Optional[int]:
    """The checkpoint step the KL penalty is measured against, or None (no penalty, or the base model: step 0)."""
    algorithm = config.algorithm
    return algorithm.kl_penalty_reference_step or None if algorithm.kl_penalty_coef > 0 else None


def fetch_result(config: Any) -> Optional[dict]:
    """The run's backed-up result.json (written by the run itself, wherever it ran), or None."""
    data = fetch_file(config, "result.json")
    return None if data is None else json.loads(data)


def fetch_file(config: Any, rel: str) -> Optional[bytes]:
    """One file of the run's backup (``result.json``, ``history.jsonl``), or None when it is not there."""
    storage = config.storage
    bucket = resolve_bucket(storage)
    if not storage.enabled or not bucket:
        return None
    root = "/".join(p for p in (storage.prefix, config.project, config.run.name) if p)
    client = _s3_client(storage)
    try:
        return client.get_object(Bucket=bucket, Key=f"{root}/{rel}")["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    except Exception as e:
        if is_network(e):
            raise
        from botocore.exceptions import BotoCoreError, ClientError

        if not isinstance(e, (BotoCoreError, ClientError)):
            raise
        label = bucket_label(storage)  # a credential error, a bucket that does not exist or refuses: one line
        raise StorageError(f"{rel} from s3://{label}/{root}: {_describe(e, bucket, label)}") from None


def upload_verified(client: Any, bucket: str, label: str, path: Path, key: str) -> dict:
    """Upload one file and check what landed: its size, and its ETag where that is the md5 (a single part, not
    encrypted with SSE-KMS or SSE-C, whose ETags are not: a bucket encrypting with KMS by default failed every
    backup, leaving a managed job nothing to recover from)."""
    size, md5 = path.stat().st_size, _md5(path)
    client.upload_file(str(path), bucket, key)
    head = client.head_object(Bucket=bucket, Key=key)
    etag = head["ETag"].strip('"')
    is_md5 = "-" not in etag and head.get("ServerSideEncryption") in (None, "AES256") and not head.get(
        "SSECustomerAlgorithm")
    if head["ContentLength"] != size or (is_md5 and etag != md5):
        raise StorageError(f"s3://{label}/{key}: uploaded object does not match {path} (size or ETag)")
    return {"size": size, "md5": md5}


def publish_folder(storage: Any, key_root: str, folder: Path, skip: tuple[str, ...] = (),
                   gone: tuple[str, ...] = ()) -> Optional[str]:
    """Upload every file of ``folder`` (but its top-level ``skip`` folders) under
    ``s3://<bucket>/<prefix>/<key_root>/``, verified; the files named in ``gone`` that the folder no longer has are
    deleted there too (an earlier upload's, which would stand as this one's). Returns the URL (the bucket as
    ``bucket_label`` names it), or None when no bucket is configured."""
    bucket = resolve_bucket(storage)
    if not storage.enabled or not bucket:
        return None
    client, label = _s3_client(storage), bucket_label(storage)
    _ensure_bucket(client, bucket, label, storage)
    root = "/".join(p for p in (storage.prefix, key_root) if p)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).parts[0] not in skip):
        upload_verified(client, bucket, label, path, f"{root}/{path.relative_to(folder).as_posix()}")
    for name in gone:
        if not (folder / name).exists():
            client.delete_object(Bucket=bucket, Key=f"{root}/{name}")
    return f"s3://{label}/{root}"


def _ensure_bucket(client: Any, bucket: str, label: str, storage: Any) -> None:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    where = f" at {storage.endpoint_url}" if storage.endpoint_url else ""
    try:
        client.head_bucket(Bucket=bucket)
        return
    except NoCredentialsError:
        raise StorageError("storage: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
                           "environment or .env, or storage.enabled=false") from None
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in ("403", "AccessDenied", "Forbidden"):
            raise StorageError(f"storage: access to bucket {label}{where} denied: check the AWS_* credentials "
                               "and the bucket's policy") from None
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise StorageError(f"storage: bucket {label}{where}: {_describe(e, bucket, label)}") from None
    except BotoCoreError as e:
        raise StorageError(f"storage: can't reach S3{where}: {_describe(e, bucket, label)} (check storage.endpoint_url "
                           "and the network)") from None
    if not storage.create_bucket:
        raise StorageError(f"storage: bucket {label}{where} does not exist: create it, or set "
                           "storage.create_bucket=true")
    region = storage.region or client.meta.region_name
    extra = {"CreateBucketConfiguration": {"LocationConstraint": region}} if region and region != "us-east-1" else {}
    client.create_bucket(Bucket=bucket, **extra)
    # a warning: a mistyped bucket on a fresh machine is created empty, and the run it was to resume starts at step 0
    log.warning(f"summrl: warning: created bucket {label}{where}: it holds no backup, so nothing is restored from it "
                "(a run this was to resume starts at step 0: check storage.bucket)")
