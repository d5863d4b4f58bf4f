"""The batch on this machine: one worker in this process, or N worker processes.

    for result in run_local(jobs, spec, workers=2): ...     # results as recordings finish

Each process loads the model once (the pool's initializer) and takes recordings one at a time
from the shared queue; its Numba threads are the machine's cores divided among the workers
(spec.threads). A worker process that dies (killed, out of memory) fails the recordings it had
and the ones not yet started, each reported; the outputs already written stay.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from .work import Worker

_worker = None               # the model of this worker process


def _init(spec):
    global _worker
    _worker = Worker(spec)


def _run(job):
    return _worker(job)


def run_local(jobs, spec, workers=1):
    if workers <= 1 or len(jobs) <= 1:
        w = Worker(spec)
        for job in jobs:
            yield w(job)
        return
    workers = min(workers, len(jobs))
    ctx = multiprocessing.get_context("spawn")       # a fresh interpreter: no forked Numba threads
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init, initargs=(spec,)) as ex:
        pending = {ex.submit(_run, job): job for job in jobs}
        for f in as_completed(pending):
            try:
                yield f.result()
            except BrokenProcessPool as e:
                job = pending[f]
                yield {"path": job.path, "ok": False, "audio_s": 0.0, "wall_s": 0.0,
                       "error": f"the worker process died: {e}"}


def threads_each(workers, cores):
    return max(1, cores // max(1, workers))
