"""backend.managed=true: submit the task as a SkyPilot managed job (``sky.jobs.launch``).

A single run then streams the job's logs until it ends, as the cluster path does; a ``-m`` sweep returns at once.
SkyPilot's jobs controller (a small CPU VM it starts, which stops itself when idle) provisions the machine, restarts
the job on a new one after a preemption (or an error, up to ``job_recovery.max_restarts_on_errors``) and takes it
down at the end. A restarted job runs its command from scratch on a fresh machine; the command is the same
``python -m summrl.train ... run.name=<name>``, so it restores the latest complete checkpoint from S3 and goes on
(storage.enabled=true is required by config validation). The local run folder gets a ``result.json`` saying what was
submitted: ``summrl.sweep`` reads it to find the job, its backup and its price.
"""

from __future__ import annotations

import logging
import shlex
import time
from typing import Any, Optional

from summrl.errors import ConfigError
from summrl.job import RunRecord

log = logging.getLogger(__name__)


def submission(config: Any, name: str, job_id: int, estimate: Any) -> dict:
    """What summrl.sweep needs to find the job and its backup, and to price it. No secret: a bucket named by
    $BACKUP_BUCKET is read from the environment again (bucket: null)."""
    s = config.storage
    return {"id": job_id, "name": name, "submitted_at": time.time(),
            "usd_per_hour": estimate.price.usd_per_hour, "price_source": estimate.price.source,
            "machine": estimate.price.machine, "estimated_usd": estimate.total_usd,
            "backup": {"bucket": s.bucket, "prefix": s.prefix, "endpoint_url": s.endpoint_url, "region": s.region,
                       "project": config.project, "run_name": config.run.name}}


def submit(config: Any, task: Any, name: str, estimate: Any, record: Optional[RunRecord] = None) -> dict:
    """Submit the managed job and record it in the local run folder's result.json; returns the submission record
    (its ``id``) at once."""
    import sky

    record = record or RunRecord(config.run.dir)
    check_not_running(record)
    log.info(f"summrl: submitting run {config.run.name} as managed job {name}")
    request = sky.jobs.launch(task, name=name)
    try:
        job_ids, _ = sky.stream_and_get(request)
    except KeyboardInterrupt:  # SkyPilot's API server carries on with the request without this terminal
        sky.get(sky.api_cancel(request, silent=True))
        log.error(f"\nsummrl: cancelled the submission of managed job {name}. If it had already reached SkyPilot's "
                  f"jobs controller it runs anyway, unrecorded here: see `sky jobs queue`, and cancel it with "
                  f"`sky jobs cancel -n {name}`")
        raise
    job_id = int(job_ids[0])
    managed = submission(config, name, job_id, estimate)
    record.update(status="submitted", run_name=config.run.name, run_dir=config.run.dir, seed=config.seed,
                  managed_job=managed, **record.job.record())
    record.save(timed=False)
    where = record.job.sweep and str(record.run_dir.parent) or config.run.dir
    log.info(f"summrl: submitted managed job {job_id} ({name}); it runs and recovers without this terminal. "
             f"See it with `python -m summrl.sweep status {shlex.quote(str(where))}` or `sky jobs logs {job_id}`")
    return managed


def check_not_running(record: RunRecord) -> None:
    """A run folder whose managed job has not ended is not submitted again: the same sweep command rerun in its folder
    (or a run's command after Ctrl-C left its logs) submitted a second billed job that backed up to the same S3
    folder, and its record replaced the only one of the first job here, so summrl.sweep no longer saw or cancelled it.
    A job that ended (or that SkyPilot's queue no longer holds) may be submitted again."""
    from summrl.cloud.sweep import ended, field, queue  # SkyPilot's queue, read as `summrl.sweep status` reads it

    earlier = record.earlier.get("managed_job")
    if not isinstance(earlier, dict) or not isinstance(earlier.get("id"), int):
        return
    job_id = earlier["id"]
    records = queue([job_id])  # None: the jobs controller has stopped, so every job has ended
    found = None if records is None else records.get(job_id)
    if found is None or ended(found):
        return
    state = field(found, "status")
    where = shlex.quote(str(record.run_dir.parent if record.job.sweep else record.run_dir))
    raise ConfigError(f"run {earlier.get('backup', {}).get('run_name') or record.run_dir.name}: managed job {job_id} "
                      f"({earlier.get('name')}), submitted from {record.run_dir}, is {getattr(state, 'value', state)}: "
                      "submitting it again would start a second billed job backing up to the same S3 folder. Follow "
                      f"it with `python -m summrl.sweep status {where}`, or cancel it first (`python -m summrl.sweep "
                      f"cancel {where}`) to submit it again")


def follow(name: str, job_id: int) -> Optional[int]:
    """Stream the managed job's logs until it ends (across its recoveries), as `sky jobs launch` does; returns
    SkyPilot's exit code (0 succeeded, 100 failed, 103 cancelled), or None when the logs can't be streamed: the job
    goes on either way. Ctrl-C stops watching, not the job."""
    import sky

    from summrl.errors import NETWORK_FIX, is_network, network_message

    log.info(f"summrl: streaming the logs of managed job {job_id}; Ctrl-C stops watching, the job goes on")
    try:
        code = sky.jobs.tail_logs(job_id=job_id, follow=True)
    except KeyboardInterrupt:  # not the run's interruption: its record stays "submitted", and rerunning the command
        # would submit a second, billed job (it said "run the same command to start again")
        log.warning(f"\nsummrl: stopped watching managed job {job_id} ({name}); it goes on without this terminal. "
                    f"Its logs: sky jobs logs {job_id}; its state: sky jobs queue; cancel it: sky jobs cancel {job_id}")
        return None
    except Exception as e:
        if not is_network(e):
            raise
        log.warning(f"summrl: warning: the logs of managed job {job_id} can't be streamed ({network_message(e)}; "
                    f"{NETWORK_FIX}); the job goes on: sky jobs logs {job_id}")
        return None
    if code is not None and int(code) == 101:  # SkyPilot's NOT_FINISHED: the stream ended, not the job
        log.warning(f"summrl: warning: the logs of managed job {job_id} stopped streaming before it ended; it goes "
                    f"on: sky jobs logs {job_id}")
        return None
    return None if code is None else int(code)
