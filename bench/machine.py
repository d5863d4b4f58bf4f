"""What every benchmark script shares about the machine it measures: the repository root, the
thread count each system is given, the variables that set it, and the CPU's feature flags."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREADS = 2
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def cpu_flags():
    """The first CPU's feature flags in /proc/cpuinfo."""
    with open("/proc/cpuinfo") as f:
        line = next((ln for ln in f if ln.startswith("flags")), "flags :")
    return set(line.split(":", 1)[1].split())
