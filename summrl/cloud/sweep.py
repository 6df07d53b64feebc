"""`python -m summrl.sweep status|pull|cancel <sweep or run folder>`: the managed jobs a sweep submitted.

Each job folder's ``result.json`` says what was submitted (summrl.cloud.managed): the job's id, its S3 backup and
its hourly price. ``status`` joins SkyPilot's record of each job (state, recoveries, time run) with the run's backed-up
history (its step and last val score) and prices the time run (summrl.cloud.pricing's price at submission).
``pull`` brings each run's ``result.json`` and ``history.jsonl`` down from S3 into its job folder, where
``summrl.report`` reads them as it reads a local sweep. ``cancel`` cancels every job not yet finished.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

from summrl.errors import exit_on
from summrl.job import jsonl_rows, read_result, write_atomic, write_result
from summrl.keys import load_env_file
from summrl.storage import fetch_file

COLUMNS = ("job", "run", "managed job", "state", "step", "last val", "recoveries", "$ so far")


def job_folders(folder: Path) -> list[Path]:
    """The run folder itself, or the sweep's numbered job folders (as summrl.report reads them)."""
    if (folder / "result.json").is_file():
        return [folder]
    return sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def submitted(folder: Path) -> list[tuple[Path, dict]]:
    """(job folder, its managed_job record) for every job the sweep submitted."""
    found = []
    for job in job_folders(folder):
        managed = (read_result(job) or {}).get("managed_job")
        if isinstance(managed, dict) and "id" in managed and isinstance(managed.get("backup"), dict):
            found.append((job, managed))  # (a record edited by hand, without them, was a KeyError)
    return found


def backup_config(managed: dict) -> Any:
    """The storage settings summrl.storage reads, from the submission record."""
    b = managed["backup"]
    storage = SimpleNamespace(enabled=True, bucket=b["bucket"], prefix=b["prefix"], endpoint_url=b["endpoint_url"],
                              region=b["region"])
    return SimpleNamespace(storage=storage, project=b["project"], run=SimpleNamespace(name=b["run_name"]))


def history_rows(data: Optional[bytes]) -> list[dict]:
    return jsonl_rows((data or b"").decode(errors="replace"))  # a line a crash cut short is skipped


def progress(rows: list[dict]) -> tuple[Optional[int], Optional[float]]:
    """The last step trained and the last val score, from ART's history rows."""
    steps = [int(r["training_step"]) for r in rows if "training_step" in r]
    val = [r["val/reward"] for r in rows if "val/reward" in r]
    return (max(steps) if steps else None), (val[-1] if val else None)


def field(record: Any, name: str) -> Any:
    """A SkyPilot job record's field (a pydantic record, or a mapping)."""
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def queue(ids: list[int]) -> Optional[dict[int, Any]]:
    """SkyPilot's records of these managed jobs, by id (the controller is not woken up for it); None when SkyPilot's
    jobs controller has stopped, which it does 10 idle minutes after its last job ended: every job has ended."""
    import sky

    try:
        records, *_ = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=ids))
    except sky.exceptions.ClusterNotUpError:
        return None
    return {int(field(r, "job_id")): r for r in records}


def ended(record: Any) -> bool:
    from sky.jobs.state import ManagedJobStatus

    state = field(record, "status")
    return ManagedJobStatus(getattr(state, "value", state)).is_terminal()


ENDED_STOPPED = "ENDED (controller stopped)"  # a job's state once the jobs controller has stopped
CONTROLLER_STOPPED = ("SkyPilot's jobs controller has stopped (it stops 10 idle minutes after its last job ends): "
                      "every job has ended, and their states and time run are not read without waking it "
                      "(`sky jobs queue --refresh`)")


def spent(managed: dict, record: Any) -> Optional[float]:
    """$ so far: the hourly price at submission x the time SkyPilot says the job has run (across recoveries)."""
    price = managed.get("usd_per_hour")
    if price is None or record is None:  # not in SkyPilot's queue: its time run is not known
        return None
    return price * (field(record, "job_duration") or 0.0) / 3600


def status(folder: Path) -> list[dict]:
    jobs = submitted(folder)
    records = queue([m["id"] for _, m in jobs]) if jobs else {}
    rows = []
    for job, managed in jobs:
        record = None if records is None else records.get(int(managed["id"]))
        step, val = progress(history_rows(fetch_file(backup_config(managed), "history.jsonl")))
        if record is not None:
            state = field(record, "status")
        else:
            state = ENDED_STOPPED if records is None else "UNKNOWN (not in SkyPilot's queue)"
        rows.append({"job": job.name, "run": managed["backup"]["run_name"], "managed job": managed["id"],
                     "state": getattr(state, "value", state), "step": step, "last val": val,
                     "recoveries": field(record, "recovery_count") if record is not None else None,
                     "$ so far": spent(managed, record)})
    return rows


def render(rows: list[dict]) -> str:
    def cell(key: str, value: Any) -> str:
        if value is None:
            return "-"
        if key == "$ so far":
            return f"${value:,.2f}"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    table = [list(COLUMNS)] + [[cell(k, r[k]) for k in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]
    total = [r["$ so far"] for r in rows]
    if rows:
        lines.append(f"total so far: {'unknown' if None in total else f'${sum(total):,.2f}'}")
    return "\n".join(lines)


def pull(folder: Path) -> list[str]:
    """Each run's backed-up result.json and history into its job folder; returns what was missing."""
    missing = []
    for job, managed in submitted(folder):
        backup = backup_config(managed)
        result = fetch_file(backup, "result.json")
        history = fetch_file(backup, "history.jsonl")
        if result is None:
            missing.append(f"{job.name}: no result.json in the backup yet (the run has not trained a step)")
        else:  # the run's own record, plus what was submitted (summrl.sweep keeps finding the job)
            write_result(job, {**json.loads(result), "managed_job": managed})
        if history is not None:
            target = job / "art" / backup.project / "models" / backup.run.name / "history.jsonl"
            write_atomic(target, history)  # a pull killed mid-write left a cut history, read as fewer steps
    return missing


def cancel(folder: Path) -> tuple[list[int], list[int]]:
    """Cancel every job not yet ended; returns (cancelled, already ended or unknown to SkyPilot)."""
    import sky

    ids = [int(m["id"]) for _, m in submitted(folder)]
    records = queue(ids)
    live = [i for i in ids if records is not None and i in records and not ended(records[i])]
    if live:
        try:
            sky.get(sky.jobs.cancel(job_ids=live))
        except sky.exceptions.ClusterNotUpError:  # the controller stopped since: they have ended
            live = []
    return live, [i for i in ids if i not in live]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m summrl.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["status", "pull", "cancel"])
    parser.add_argument("folder", type=Path, help="a sweep folder (multirun/<date>/<time>) or one run's folder")
    args = parser.parse_args(argv)
    load_env_file()  # AWS_* and BACKUP_BUCKET, as the jobs read them
    if not args.folder.is_dir():
        print(f"summrl: {args.folder} is not a folder", file=sys.stderr)
        return 2
    jobs = submitted(args.folder)
    if not jobs:
        print(f"summrl: no managed job was submitted from {args.folder} (backend.managed=true records one per job)",
              file=sys.stderr)
        return 2
    if args.command != "cancel" and not os.environ.get("BACKUP_BUCKET") and any(
            not m["backup"]["bucket"] for _, m in jobs):
        # the jobs were backed up to $BACKUP_BUCKET (not written down): every run read as "not trained a step yet"
        print("summrl: the jobs back up to the bucket $BACKUP_BUCKET named when they were submitted, and it is not set "
              "here: export BACKUP_BUCKET=<that bucket> (or put it in .env)", file=sys.stderr)
        return 2
    try:
        return _command(args)
    except Exception as e:  # S3 or SkyPilot refusing (credentials, a bucket, the API server): one line, its code
        exit_on(e)


def _command(args: argparse.Namespace) -> int:
    if args.command == "status":
        rows = status(args.folder)
        print(render(rows))
        if any(r["state"] == ENDED_STOPPED for r in rows):
            again = f"python -m summrl.sweep pull {shlex.quote(str(args.folder))}"
            print(f"summrl: {CONTROLLER_STOPPED}; `{again}` brings their results")
    elif args.command == "pull":
        missing = pull(args.folder)
        for line in missing:
            print(f"summrl: {line}", file=sys.stderr)
        print(f"summrl: pulled {len(submitted(args.folder)) - len(missing)} runs into {args.folder}; "
              f"python -m summrl.report {shlex.quote(str(args.folder))}")
    else:
        cancelled, other = cancel(args.folder)
        said = [f"cancelled managed jobs {', '.join(map(str, cancelled))}" if cancelled else "nothing to cancel"]
        if other:
            said.append(f"already ended (or not in SkyPilot's queue): {', '.join(map(str, other))}")
        print(f"summrl: {'; '.join(said)} ({time.strftime('%H:%M:%S')})")
    return 0
