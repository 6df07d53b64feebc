"""`python -m summrl.benchmark [overrides]`: compose conf/benchmark.yaml, validate it and every key the run needs,
then run the benchmark (heavy imports only after validation, so a bad value fails in about a second).

It ends like training (summrl.errors): an expected failure is one line and its kind's exit code, with no
traceback unless HYDRA_FULL_ERROR=1; Ctrl-C is one line and exit code 130, the rows scored so far kept."""

from __future__ import annotations

import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from summrl import cli
from summrl.benchmark.config import check_keys, check_trainer_overrides, same_command, validate_benchmark
from summrl.errors import Failure, end, exit_on, run_async, stop_signal
from summrl.job import task_overrides


@hydra.main(config_path="../../conf", config_name="benchmark", version_base="1.3")
def main(cfg: DictConfig) -> None:
    rerun = "the same command"
    try:
        check_trainer_overrides(task_overrides(HydraConfig.get()))
        config = validate_benchmark(cfg, dict(HydraConfig.get().runtime.choices))
        rerun = same_command(config, task_overrides(HydraConfig.get()))
        check_keys(config)
        os.environ.setdefault("TQDM_DISABLE", "1")
        for name in ("LiteLLM", "LiteLLM Router", "httpx"):  # one line per call at INFO under Hydra's logging
            logging.getLogger(name).setLevel(logging.WARNING)
        from summrl.benchmark.runner import run  # heavy (torch, ART, litellm): only once the config is good

        status = run_async(run(config, rerun=rerun))
    except KeyboardInterrupt:  # Ctrl-C: every row scored so far is in rows.csv, and a rerun skips it
        end(Failure("interrupted", f"benchmark {cfg.benchmark.name} stopped ({stop_signal()}); the rows scored so far "
                                   f"are kept: run {rerun} to resume"))
    except Exception as e:
        exit_on(e)
    sys.exit(status)


if __name__ == "__main__":
    cli.run(main)
