"""The batch on a Ray cluster, with Ray Data: the recordings are a dataset, and a pool of actors
(ray.data.ActorPoolStrategy), each holding one loaded model, transcribes it one row at a time.

    for result in run_ray(jobs, spec, workers=4, address="auto"): ...

address: "local" starts a Ray of this machine's own; "auto" joins the cluster that RAY_ADDRESS
(or a running `ray start`) names; anything else is a cluster address (ray://host:10001 or
host:6379). The actors write the outputs themselves, so OUTDIR must be storage every node sees;
the resume rules are those of a local batch (jobs.py). Needs the `ray` extra:
`pip install "nwhisper[ray]"`.
"""

from __future__ import annotations

import logging
import os

from .work import Worker, as_job


class _Actor:
    """One model per actor; a batch of rows in, the same rows' results out."""

    def __init__(self, spec):
        self.worker = Worker(spec)

    def __call__(self, batch):
        n = len(batch["path"])
        rows = [self.worker(as_job({k: batch[k][i] for k in batch})) for i in range(n)]
        return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}


def run_ray(jobs, spec, workers=1, address="local"):
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")   # its C++ side talks on stderr
    try:
        import ray
    except ImportError:
        raise RuntimeError('--ray needs Ray: pip install "nwhisper[ray]"') from None
    if not ray.is_initialized():
        quiet = dict(log_to_driver=False, logging_level=logging.WARNING)
        if address == "local":
            ray.init(include_dashboard=False, **quiet)
        else:
            ray.init(address=address, **quiet)
    ray.data.DataContext.get_current().enable_progress_bars = False     # the batch draws its own
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    rows = [{"path": j.path, "stem": j.stem, "language": j.language or ""} for j in jobs]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, len(rows)))
    results = ds.map_batches(
        _Actor, fn_constructor_kwargs={"spec": spec}, batch_size=1, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=spec.threads or 1)
    for r in results.iter_rows():
        yield {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
