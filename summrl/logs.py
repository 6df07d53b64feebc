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


class BelowError(logging.Filter):
    """The console's stdout handler takes the lines below ERROR; its stderr handler the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR
