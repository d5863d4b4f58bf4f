"""One worker's part of a batch: the model loaded once, then recording after recording.

    w = Worker(WorkerSpec(model="base", outdir="out", fmts=("srt", "json")))
    w(job)     # → {"path", "ok", "audio_s", "wall_s", "error"}; the outputs are written

The same Worker runs in this process (one worker), in each process of a local pool, and in each
actor of a Ray pool. A recording that fails — it does not decode, the model raises — comes back
with ok False and the reason; the worker goes on with the next.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

from ..records import TranscribeOptions
from .jobs import Job, write_outputs


@dataclass(frozen=True)
class WorkerSpec:
    model: str
    outdir: str
    fmts: tuple = ("txt", "json")
    device: str = "cpu"
    compute_type: str = "float32"
    threads: int | None = None             # Numba threads per worker (None: all cores)
    options: TranscribeOptions = field(default_factory=TranscribeOptions)   # abilities.options'
    vad: str | None = None                 # transcribe()'s vad
    offline: bool | None = None            # never download (None: HF_HUB_OFFLINE decides)


class Worker:
    def __init__(self, spec):
        from .. import kernel_cache
        from ..api import load

        if spec.threads:
            import numba
            numba.set_num_threads(max(1, min(spec.threads, numba.config.NUMBA_NUM_THREADS)))
        self.spec = spec
        if spec.options.diarize:
            kernel_cache.expect_speakers()      # before the model's first kernel
        self.model = load(spec.model, device=spec.device, compute_type=spec.compute_type,
                          offline=spec.offline)

    def __call__(self, job):
        from .. import writers

        s = self.spec
        t = time.perf_counter()
        out = {"path": job.path, "ok": False, "audio_s": 0.0, "wall_s": 0.0, "error": None}
        try:
            options = dataclasses.replace(s.options, language=job.language) if job.language else s.options
            segments, info = self.model.transcribe(job.path, options, vad=s.vad)
            segments = list(segments)
            stem = os.path.splitext(os.path.basename(job.path))[0]
            write_outputs(job, s.outdir, s.fmts, {f: writers.render(segments, info, f, stem) for f in s.fmts})
            out.update(ok=True, audio_s=float(info.duration))
        except Exception as e:          # this recording failed; the batch goes on
            out["error"] = _reason(e)
        out["wall_s"] = time.perf_counter() - t
        return out


def _reason(e):
    from ..io.audio import AudioError

    if isinstance(e, (AudioError, FileNotFoundError, IsADirectoryError)):
        return str(e)
    return f"{type(e).__name__}: {e}"


def as_job(row):
    """A Job from a row of Ray Data's batch (its columns are the Job's fields)."""
    lang = row.get("language")
    return Job(str(row["path"]), str(row["stem"]), None if lang in (None, "") else str(lang))


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
