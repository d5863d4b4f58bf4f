"""A batch from start to end: what is left to do, the progress bar, the summary.

    summary = run(jobs, spec, workers=2)              # or ray="local" | "auto" | ADDRESS
    summary.failed                                    # [{"path", "error"}], also in failures.jsonl

Recordings whose outputs all exist are skipped (a rerun finishes what a stopped one left). The
bar (tqdm, on stderr) counts the audio done — in hours, minutes or seconds as the batch's size
asks; each recording's length read from its header before anything runs — with the speed as
× real time and the time left at that speed. At the
end: how many were transcribed, skipped and failed, and OUTDIR/failures.jsonl lists the failed
ones with their reasons (it is removed when a run has none).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from .jobs import done


@dataclass
class Summary:
    transcribed: int = 0
    skipped: int = 0
    failed: list = field(default_factory=list)
    audio_s: float = 0.0
    wall_s: float = 0.0

    def line(self):
        speed = self.audio_s / self.wall_s if self.wall_s > 0 else 0.0
        return (f"{self.transcribed} transcribed, {self.skipped} already done, {len(self.failed)} "
                f"failed; {_clock(self.audio_s)} of audio in {_clock(self.wall_s)} "
                f"({speed:.1f}x real time)")


def _clock(seconds):
    m, s = divmod(seconds, 60)
    h, m = divmod(int(m), 60)
    return f"{h}:{m:02d}:{s:04.1f}"


def probe_seconds(path):
    """A recording's length from its header (0.0 when it cannot be read: the batch says why)."""
    import soundfile as sf
    try:
        return float(sf.info(path).duration)
    except Exception:
        pass
    try:
        import av
        with av.open(path, metadata_errors="ignore") as c:
            return (c.duration or 0) / 1e6
    except Exception:
        return 0.0


def run(jobs, spec, workers=1, ray=None, progress=True):
    from tqdm import tqdm

    summary = Summary()
    todo = [j for j in jobs if not done(j, spec.outdir, spec.fmts)]
    summary.skipped = len(jobs) - len(todo)
    seconds = {j.path: probe_seconds(j.path) for j in todo}
    os.makedirs(spec.outdir, exist_ok=True)
    t0 = time.perf_counter()
    total_s = sum(seconds.values())
    unit, scale = next((u, k) for u, k in (("h", 3600), ("min", 60), ("s", 1)) if total_s >= k or k == 1)
    bar = tqdm(total=total_s / scale, disable=not progress or not todo,
               bar_format="{percentage:3.0f}%|{bar}| {n:.2f}/{total:.2f} " + unit + " of audio "
                          "[{elapsed}<{remaining}{postfix}]")
    if ray is not None:
        from .on_ray import run_ray
        results = run_ray(todo, spec, workers, ray)
    else:
        from .pool import run_local
        results = run_local(todo, spec, workers)
    try:
        for r in results:
            if r["ok"]:
                summary.transcribed += 1
                summary.audio_s += r["audio_s"]
            else:
                summary.failed.append({"path": r["path"], "error": r["error"]})
                bar.write(f"nwhisper: {r['error']}")
            bar.update(seconds.get(r["path"], 0.0) / scale)
            elapsed = time.perf_counter() - t0
            bar.set_postfix_str(f"{summary.audio_s / elapsed:.1f}x real time", refresh=True)
    finally:
        bar.close()
        summary.wall_s = time.perf_counter() - t0
        _failures(spec.outdir, summary.failed)
    return summary


def _failures(outdir, failed):
    path = os.path.join(outdir, "failures.jsonl")
    if not failed:
        if os.path.exists(path):
            os.unlink(path)
        return
    with open(path, "w", encoding="utf-8") as f:
        for r in failed:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
