"""Where a finished benchmark's folder goes besides the disk: S3 when a bucket is configured, W&B with logger=wandb."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from summrl.secrets import redact
from summrl.storage import publish_folder
from summrl.tracking import wandb_id, wandb_mode

log = logging.getLogger(__name__)

# What a run writes from its rows: removed when this run has none of them, here and where it was published
OUTPUTS = ("summary.csv", "summary.md", "models.png", "steps.png")


def publish(config, out_dir: Path) -> None:
    """Upload ``out_dir`` (rows, tables, charts) to S3, and log it as one W&B run. A failure here warns and keeps
    the local folder: the results are already on disk, and a rerun publishes them again."""
    try:
        url = publish_folder(config.storage, f"{config.project}/benchmarks/{config.benchmark.name}", out_dir,
                             skip=("wandb",), gone=OUTPUTS)
        if url:
            log.info(f"summrl: benchmark results uploaded to {url}")
    except Exception as e:
        log.warning(f"summrl: warning: benchmark results not uploaded ({type(e).__name__}: {redact(str(e))}); "
                    f"they are in {out_dir}")
    if config.logger.kind == "wandb":
        log_to_wandb(config, out_dir)


def log_to_wandb(config, out_dir: Path) -> None:
    import pandas as pd
    import wandb


    name = config.benchmark.name
    settings = {k: v for k, v in asdict(config).items() if k != "choices"}
    run = wandb.init(
        project=config.logger.project, entity=config.logger.entity, id=wandb_id(f"benchmark-{name}"),
        resume="allow", name=f"benchmark {name}", group="benchmark", job_type="benchmark",
        tags=[f"{g}={config.choices[g]}" for g in ("reward", "judge", "model") if config.choices.get(g)],
        config=redact({**settings, **{g: c for g, c in config.choices.items() if c}}), dir=str(out_dir),
        mode=wandb_mode(config.logger), reinit="create_new", settings=wandb.Settings(console="off", x_disable_stats=True),
    )
    logged = {}
    for table in ("summary", "rows"):
        path = out_dir / f"{table}.csv"
        if path.is_file():
            logged[f"benchmark/{table}"] = wandb.Table(dataframe=pd.read_csv(path))
    for chart in sorted(out_dir.glob("*.png")):
        logged[f"benchmark/{chart.stem}"] = wandb.Image(str(chart))
    run.log(logged)
    run.finish()
