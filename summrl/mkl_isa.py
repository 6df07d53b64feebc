"""MKL's AVX-512 kernels on AMD processors too.

PyTorch sends most CPU matrix products to MKL (attention's blocks, LoRA's small products; the embedded engine's large
ones go to oneDNN, see ``backends/embedded/linear.py``). MKL asks ``mkl_serv_intel_cpu_true()`` whether the
processor is Intel's, and on an AMD one runs its AVX2 kernels even where the processor has AVX-512. On a 2-core AMD
EPYC (Zen 5), float32: a 992 x 576 x 1536 product at 200 GFLOPS where the AVX-512 kernel reaches 415; attention's
forward and backward pass over a 480-token prompt 12.7 ms where it takes 6.7.

The extension ``summrl._mkl_isa`` (built at install where a C compiler is found) defines that function as returning
1. Loaded into the process's global symbols before PyTorch is, it is the definition MKL calls, and MKL then picks its
kernels by the instruction sets the processor reports: AVX-512 where it has them, AVX2 where not. Intel processors
are left alone (MKL's own answer is already yes). ``SUMMRL_MKL_ISA=0`` leaves MKL as it is everywhere.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

ACTIVE = False  # whether this process's MKL took the definition


def _cpuinfo_says(key: str, word: str) -> bool:
    """Whether a /proc/cpuinfo line of ``key`` (vendor_id, flags) holds ``word`` (False off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith(key) and word in line.split() for line in f)
    except OSError:
        return False


def _amd() -> bool:
    return _cpuinfo_says("vendor_id", "AuthenticAMD")


def widest_kernels() -> bool:
    """Whether MKL's products run on the widest kernels the processor has: everywhere but on an AMD processor with
    AVX-512 where the extension is not loaded (then MKL runs AVX2 kernels, half as fast as oneDNN's)."""
    return ACTIVE or not _amd() or not _cpuinfo_says("flags", "avx512f")


def load() -> bool:
    """Put the definition ahead of MKL's own, where it applies: Linux on an AMD x86-64 processor, PyTorch not yet
    imported (MKL is linked into it and binds the name on its first call), the extension built."""
    global ACTIVE
    if ACTIVE or os.environ.get("SUMMRL_MKL_ISA") == "0" or "torch" in sys.modules:
        return ACTIVE
    if sys.platform != "linux" or os.uname().machine != "x86_64" or not _amd():
        return False
    spec = importlib.util.find_spec("summrl._mkl_isa")
    if spec is None or not spec.origin:
        return False  # installed without a C compiler
    ctypes.CDLL(spec.origin, mode=ctypes.RTLD_GLOBAL)
    ACTIVE = True
    return True
