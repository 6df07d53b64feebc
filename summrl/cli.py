"""Run a ``@hydra.main`` entry point (train, benchmark) so that a config Hydra can't compose ends like every other
config error: one line naming the key's full path, with a hint (summrl.config.config_error), and exit code 2.

Hydra prints a composition error itself and exits 1. With ``HYDRA_FULL_ERROR=1`` it raises instead, so the entry
point sets that for Hydra and keeps the user's own choice in ``SUMMRL_FULL_ERROR``: summrl.errors shows
tracebacks only when the user asked for them.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from hydra.errors import CompactHydraException, ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from summrl.config import config_error
from summrl.errors import Failure, full_errors


def run(main: Callable[[], object]) -> None:
    os.environ.setdefault("SUMMRL_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR", ""))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises what it would print; the user's choice is kept above
    try:
        main()
    except (ConfigCompositionException, OmegaConfBaseException) as e:
        if full_errors():
            raise
        failure = Failure("config", str(config_error(e)))
        print(failure.line, file=sys.stderr, flush=True)
        sys.exit(failure.exit_code)
    except CompactHydraException as e:  # a sweep's failed jobs (train.JobFailed), Hydra's own usage errors
        if full_errors():
            raise
        print(e, file=sys.stderr, flush=True)
        sys.exit(1)
