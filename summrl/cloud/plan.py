"""The jobs a command launches, each with its estimated cost: one run, or every job of a ``-m`` sweep.

Hydra hands a multirun's job only its own overrides, so the sweep is read again the way Hydra's basic sweeper
expands it: the sweeper's params (an experiment preset's), then the command line's overrides, split into jobs by
``BasicSweeper.split_arguments``. Each job is composed and priced once per process (summrl.cloud.pricing).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

from summrl.cloud import pricing
from summrl.cost import Calls
from summrl.errors import ConfigError

log = logging.getLogger(__name__)

_cache: dict[tuple, list] = {}


def not_run(name: str) -> pricing.Estimate:
    """A job that will not run (its config is refused): $0 of GPU and judge."""
    return pricing.Estimate(run=name, price=pricing.Price(0.0, "none", "none"), hours=0.0,
                            judge=Calls(f"judge ({name}: not run)", None))


def sweep_overrides(argv: list[str], params: dict) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands ``params`` and the command line's task overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    # Hydra's own reading of its command line: a flag's value (-cn train, --config-dir DIR) is no override (it was
    # parsed as one, failed, and the whole sweep's budget check fell back to job 0 alone)
    parser = get_args_parser()
    parser.exit_on_error = False  # a command line Hydra would not take: the caller's fallback, not an exit
    try:
        given = parser.parse_known_args(argv)[0].overrides
    except SystemExit:
        raise ValueError(f"not a Hydra command line: {argv}") from None
    task = [a for a in given if not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    parser = OverridesParser.create()
    overrides = parser.parse_overrides([f"{k}={v}" for k, v in params.items()]) + parser.parse_overrides(task)
    (jobs,) = BasicSweeper.split_arguments(overrides, None) or [[[]]]
    return jobs


def estimates(config: Any, overrides: list[str], job_num: Optional[int]) -> list[pricing.Estimate]:
    """This run's estimate; in a multirun, every job's, in job order (this job's at ``job_num``)."""
    if job_num is None:
        return [pricing.estimate_run(config)]
    from hydra.core.hydra_config import HydraConfig

    params = dict(HydraConfig.get().sweeper.get("params") or {})
    try:
        jobs = sweep_overrides(sys.argv[1:], params)
    except Exception:  # not the command line of this sweep (a launcher running jobs in other processes)
        jobs = []
    if len(jobs) <= job_num or sorted(jobs[job_num]) != sorted(overrides):
        log.warning(f"summrl: warning: the sweep's other jobs could not be read back from the command line (another "
                    f"sweeper, such as Optuna's, or launcher): the sweep so far is priced as {job_num + 1} jobs of this "
                    "one's estimate and checked so against backend.max_cost_usd, so a job is refused only once the jobs "
                    "before it, which may be running, have spent the budget")
        return [pricing.estimate_run(config)] * (job_num + 1)
    key = (tuple(sys.argv), tuple(sorted(params.items())))
    if key not in _cache:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.types import RunMode

        from summrl.config import validate

        hydra = GlobalHydra.instance().hydra  # the running app's own loader: the same search path and schemas
        name = HydraConfig.get().job.config_name
        found = []
        for num, job in enumerate(jobs):
            if num == job_num:
                found.append(pricing.estimate_run(config))
                continue
            try:
                other = validate(hydra.compose_config(name, job, run_mode=RunMode.RUN))
            except ConfigError as e:  # it fails on its own, with its own line: not this job's error, and costs $0
                log.warning(f"summrl: warning: job {num} of the sweep ({' '.join(job)}) has a config error, so it "
                            f"will fail on its own and is priced $0: {e}")
                found.append(not_run(f"job {num}"))
                continue
            other.run.name = f"{other.run.name}-{num}"
            found.append(pricing.estimate_run(other))
        _cache[key] = found
        return found
    # A later job of the sweep: its own estimate from its own config. The earlier job's composition of it resolved
    # run.name's default ${now} at another time, so it would name another run than this job's task and managed job.
    return [pricing.estimate_run(config) if num == job_num else e for num, e in enumerate(_cache[key])]
