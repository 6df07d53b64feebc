"""summrl: Hydra-configured GRPO training of document summarizers on OpenPipe ART."""

import os

# litellm (imported by ART) fetches its model cost map from the network at import time unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# oneDNN keeps each matrix product's compiled kernel per shape, up to 1024 of them, and every packed training row has
# a length of its own: a 16-step experiment=local run crept about 9 MB a trained row and peaked at 3.02 GB; with 64
# kept, 2.92 GB in the same time (287 vs 290 s). A decode step's few shapes stay cached. Read at oneDNN's first use.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")

# MKL may run a product on fewer threads than it was given when it judges the machine busy, and a product split
# another way sums in another order: with a group's order fixed, one pair of experiment=local runs still differed in
# its step-0 val pass; with this set, two pairs of runs matched bit for bit.
# Fixed thread counts keep a seeded run's numbers the same from run to run. Read at MKL's first use.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

# Before anything imports PyTorch: MKL's AVX-512 kernels on AMD processors too (see summrl/mkl_isa.py)
from summrl import mkl_isa  # noqa: E402

mkl_isa.load()

__version__ = "0.1.0"
