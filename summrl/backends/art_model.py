"""The ART model summrl trains and serves: ART's TrainableModel without a W&B run of its own."""

from __future__ import annotations

from typing import Any, Optional

import art


class TrainableModel(art.TrainableModel):
    def _get_wandb_run(self) -> Optional[Any]:
        # summrl's tracker is the job's one W&B run (logger=wandb mirrors history.jsonl; logger=none: none at all).
        # ART 0.5.18's LocalBackend (register, train) and ServerlessBackend (train) opened their own whenever
        # WANDB_API_KEY was set, whatever report_metrics said, with the run's name as its id: a second writer to the
        # tracker's run, renaming it and replacing its config, from the benchmark and summrl.serve as well. ART only
        # records provenance on it, and skips that when there is none.
        return None
