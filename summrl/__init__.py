"""summrl: Hydra-configured GRPO training of document summarizers on OpenPipe ART."""

import os

# litellm (imported by ART) fetches its model cost map from the network at import time unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Before anything imports PyTorch: MKL's AVX-512 kernels on AMD processors too (see summrl/mkl_isa.py)
from summrl import mkl_isa  # noqa: E402

mkl_isa.load()

__version__ = "0.1.0"
