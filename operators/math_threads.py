"""How many threads an engine's math may use in this process."""
from __future__ import annotations

import os


def use_threads(threads: int | None) -> None:
    """Set this process's math threads (torch's intra-op pool, and OpenMP's for what starts later).

    Ray starts an actor with one thread per CPU it reserves (OMP_NUM_THREADS), so an engine on a
    CPU uses one core however many the machine has: `compute.threads_per_engine` gives it more
    (0: every core this process may run on). None leaves Ray's setting.
    """
    if threads is None:
        return
    import torch

    count = threads or len(os.sched_getaffinity(0))
    os.environ["OMP_NUM_THREADS"] = str(count)
    torch.set_num_threads(count)
