"""summrl: Hydra-configured GRPO training of document summarizers on OpenPipe ART."""

import os

# litellm (imported by ART) fetches its model cost map from the network at import time unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
