"""`python -m summrl.train [overrides]`: compose, validate, run one training job.

Heavy libraries (torch, ART, litellm) are imported only after the config is validated, so a bad
value fails in about a second. Returns the final validation score for Hydra sweepers.

In a multirun a failing job (even a config error) is recorded in its ``result.json`` as failed and
raises an ordinary exception: Hydra runs the sweep's other jobs, then exits non-zero.
"""

from __future__ import annotations

import asyncio
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from summrl.config import Config, ConfigError, validate
from summrl.job import JobInfo, write_result


def load_config(cfg: DictConfig) -> Config:
    """Validate the composed config and load .env; in a multirun, name each job apart.
    What the run needs from the machine and the environment (keys, GPU, bucket) is the preflight's."""
    from dotenv import load_dotenv

    hydra_cfg = HydraConfig.get()
    config = validate(cfg)
    load_dotenv()  # keys may live in .env; they are read from the environment, never from config
    if hydra_cfg.mode == RunMode.MULTIRUN:
        config.run.name = f"{config.run.name}-{hydra_cfg.job.num}"
    return config


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    job = JobInfo.from_hydra()
    try:
        config = load_config(cfg)
        if config.backend.kind == "skypilot":  # this same job on a cloud GPU, with backend=local_gpu there
            from summrl.cloud.launch import run_from_hydra

            return run_from_hydra(config)
        from summrl.preflight import check

        check(config)  # the backend's packages, GPU and keys, and the backup bucket: all listed, before loading
    except ConfigError as e:
        print(f"summrl: config error: {e}", file=sys.stderr)
        if job.sweep is None:
            sys.exit(2)
        # SystemExit would end the whole sweep; an exception fails this job only.
        write_result(HydraConfig.get().runtime.output_dir, {"status": "failed", "error": f"config error: {e}",
                                                            **job.record()})
        raise
    # ART's gather draws a progress bar per batch; the loop prints one line per step instead.
    os.environ.setdefault("TQDM_DISABLE", "1")
    from summrl.loop import train  # heavy imports only now

    return asyncio.run(train(config, job))


if __name__ == "__main__":
    main()
