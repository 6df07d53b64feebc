"""The ART model summrl trains and serves: ART's TrainableModel without a W&B run of its own, and with no secret in
the model.json ART writes."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import art

from summrl.secrets import redact


class TrainableModel(art.TrainableModel):
    def _get_wandb_run(self) -> Optional[Any]:
        # summrl's tracker is the job's one W&B run (logger=wandb mirrors history.jsonl; logger=none: none at all).
        # ART 0.5.18's LocalBackend (register, train) and ServerlessBackend (train) opened their own whenever
        # WANDB_API_KEY was set, whatever report_metrics said, with the run's name as its id: a second writer to the
        # tracker's run, renaming it and replacing its config, from the benchmark and summrl.serve as well. ART only
        # records provenance on it, and skips that when there is none.
        return None

    async def register(self, backend: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await super().register(backend, *args, **kwargs)
        finally:  # a failed start of vLLM after it too: the file is written first
            self._mask_saved_model()

    def _mask_saved_model(self) -> None:
        """LocalBackend writes the model, its _internal_config resolved, to <model dir>/model.json and never reads it
        back: a token given as +model.init_args.token=${oc.env:HF_TOKEN} was there in clear. Masked as result.json
        masks the config."""
        from art.utils.output_dirs import get_model_dir

        path = os.path.join(get_model_dir(model=self, art_path=self.base_path), "model.json")
        if not os.path.exists(path):
            return
        with open(path) as f:
            saved = json.load(f)
        masked = redact(saved)
        if masked != saved:
            with open(path, "w") as f:
                json.dump(masked, f)
