"""How summrl's lines reach the console and the run folder's log file: conf/hydra/job_logging/summrl.yaml.

Every module logs through ``logging.getLogger(__name__)``, its lines worded as the console shows them
(``summrl: step 0 | val ...``, ``summrl: warning: ...``). Under Hydra (train, benchmark) the ``summrl`` logger writes
each line to the console (stdout; ERROR and above, the one-line failures, on stderr) and, with a timestamp and the
module, to the run folder's ``<job>.log`` (``train.log``, ``benchmark.log``): a cluster job, or a sweep job under
joblib, leaves its account beside its results. Other libraries keep Hydra's default format; their noise is filtered
by name where it is made (judges.client, benchmark.__main__, cloud.launch).
"""

from __future__ import annotations

import logging
import sys


class BelowError(logging.Filter):
    """The console's stdout handler takes the lines below ERROR; its stderr handler the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def console() -> None:
    """For a CLI Hydra does not run (``summrl.data``): the ``summrl`` logger's lines on stdout, errors on stderr, as
    under Hydra. Called twice (a test calling the CLI in-process), it adds nothing."""
    logger = logging.getLogger("summrl")
    logger.setLevel(logging.INFO)
    if any(getattr(h, "summrl_console", False) for h in logger.handlers):
        return
    out, err = logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)
    out.addFilter(BelowError())
    err.setLevel(logging.ERROR)
    for handler in (out, err):
        handler.summrl_console = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
