"""The model a server holds: one worker thread, a fair queue, idle unload, the numbers /health shows.

    host = ModelHost("tiny.en", device="auto", unload_after=0)
    host.load()                                   # before the port opens (blocking)
    future = host.submit(lambda m: list(m.transcribe(samples)[0]))   # decoded on the worker
    segments = await future                       # on the IOLoop; the loop stays responsive

One transcription runs at a time: the device has one model, and two jobs sharing it would each
take twice as long and hold twice the scratch memory. Jobs wait in a heap ordered by
(priority, arrival), so equal-priority jobs run first come, first served; FINAL (0) runs before
DRAFT (1), which is how a stream's drafts give way to anyone's final: the host is the live
streams' door (stream/door.py). A job whose client went away is dropped from the queue
(`abandon`), not run.

All bookkeeping happens on the IOLoop thread; the worker thread only runs the job and, when the
model was unloaded, loads it first — so the model is never touched by two threads, and an unload
(done on the IOLoop when nothing is queued or running and nothing holds the model) cannot race a
job.
"""

from __future__ import annotations

import collections
import gc
import heapq
import itertools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tornado import ioloop
from tornado.concurrent import Future, future_set_exception_unless_cancelled, future_set_result_unless_cancelled

from ..abilities import Abilities
from ..stream.door import DRAFT, FINAL, Abandoned

log = logging.getLogger("nwhisper.server")

WARMUP_SECONDS = 1.0         # of silence, transcribed at startup (Numba dispatch, scratch)
WAITS_KEPT = 1000            # queue waits remembered per priority, for /health


class Job:
    __slots__ = ("priority", "seq", "fn", "future", "submitted")

    def __init__(self, priority, seq, fn):
        self.priority, self.seq, self.fn = priority, seq, fn
        self.future = Future()
        self.submitted = time.monotonic()

    def __lt__(self, other):
        return (self.priority, self.seq) < (other.priority, other.seq)


class ModelHost:
    def __init__(self, name, device="auto", unload_after=0.0, loader=None, compute_type="float32"):
        if loader is None:
            from ..api import load as loader
        self.name, self.device, self.unload_after = name, device, float(unload_after or 0)
        self.compute_type = compute_type
        self.device_name = device
        self._loader = loader
        self._model = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="nwhisper-model")
        self._queue = []
        self._seq = itertools.count()
        self._running = None         # the Job in the worker, or None
        self._holds = 0              # open streams: while > 0 the model is not unloaded
        self.shape = {}              # the model's dimensions, kept across unloads
        self.abilities = Abilities(f"this model ({name})", False, ())   # the model's, kept across unloads
        self.loads = self.unloads = 0
        self.abandoned = 0           # jobs dropped from the queue because their client left
        self.waits = {FINAL: collections.deque(maxlen=WAITS_KEPT), DRAFT: collections.deque(maxlen=WAITS_KEPT)}
        self.overtaken = 0           # finals started after a draft submitted later (never, by the heap)
        self.utterance_s = None      # how long a short utterance takes to transcribe (the warm-up's,
                                     # then live.py's moving average), None: not known
        self._last_draft_seq = -1
        self.last_load_ms = None
        self.rss_mb = None           # what the first load and warm-up added to the process
        self.last_active = time.monotonic()
        self._timer = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def loaded(self):
        return self._model is not None

    def load(self, warmup=True):
        """Load the model now (startup, before the port opens); blocks until it is ready.

        It runs on the worker thread like every later job, so the model (and on a GPU, the
        thread's view of the CUDA context) is only ever used from that one thread."""
        def go():
            before = _rss()
            self._load()
            if warmup:
                # twice: the first may compile kernels (an empty cache: seconds), and the live
                # streams' tails are sized by the time a short utterance takes (stream/live.py)
                for _ in range(2):
                    t0 = time.perf_counter()
                    list(self._model.transcribe(np.zeros(int(WARMUP_SECONDS * 16000), np.float32))[0])
                    self.utterance_s = time.perf_counter() - t0
            if before is not None:
                self.rss_mb = round((_rss() - before) / (1 << 20), 1)

        self._worker.submit(go).result()

    def _load(self):
        t0 = time.perf_counter()
        m = self._loader(self.name, device=self.device, compute_type=self.compute_type)
        self.last_load_ms = round((time.perf_counter() - t0) * 1000, 1)
        self.loads += 1
        d = m.dims
        self.shape = {k: getattr(d, k) for k in (
            "n_mels", "n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
            "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer")}
        self.abilities = m.abilities
        self.device_name = getattr(m.backend, "name", type(m.backend).__name__)
        self._model = m
        log.info("model %s loaded in %.0f ms", self.name, self.last_load_ms)

    def start_idle_timer(self):
        """Begin checking for idleness (call on the IOLoop, once the port is open)."""
        if self.unload_after > 0 and self._timer is None:
            every = min(1.0, self.unload_after / 4) * 1000
            self._timer = ioloop.PeriodicCallback(self._maybe_unload, every)
            self._timer.start()

    def _maybe_unload(self):
        if (self._model is None or self.busy or self._holds
                or time.monotonic() - self.last_active < self.unload_after):
            return
        self._model = None
        gc.collect()                 # the weights' buffers go now, not at some later collection
        self.unloads += 1
        log.info("model %s unloaded after %.0f s idle", self.name, self.unload_after)

    def hold(self):
        """An open stream keeps the model loaded until `release` (and loads it now if it was
        unloaded, so that its first utterance does not wait for the load)."""
        self._holds += 1
        self.last_active = time.monotonic()
        if self._model is None and not self.busy:
            self.submit(lambda model: None)

    def release(self):
        self._holds -= 1
        self.last_active = time.monotonic()

    def close(self):
        if self._timer is not None:
            self._timer.stop()
        self._worker.shutdown(wait=False, cancel_futures=True)

    # -- the queue ---------------------------------------------------------------------------

    @property
    def busy(self):
        return self._running is not None or bool(self._queue)

    @property
    def queued(self):
        return len(self._queue)

    def idle_s(self):
        return 0.0 if self.busy or self._holds else round(time.monotonic() - self.last_active, 1)

    def submit(self, fn, priority=FINAL):
        """Queue fn(model) for the worker thread; returns its Future (await it on the IOLoop)."""
        job = Job(priority, next(self._seq), fn)
        heapq.heappush(self._queue, job)
        self.last_active = time.monotonic()
        self._next()
        return job.future

    def abandon(self, future):
        """The job's client went away: drop it if it has not started."""
        for job in self._queue:
            if job.future is future:
                self._queue.remove(job)
                heapq.heapify(self._queue)
                self.abandoned += 1
                future_set_exception_unless_cancelled(future, Abandoned())
                return

    def wait_stats(self):
        """Queue waits (submit → start) of the recent FINAL and DRAFT jobs, in ms."""
        out = {}
        for name, p in (("final", FINAL), ("draft", DRAFT)):
            w = np.array(self.waits[p]) * 1000
            out[name] = ({"n": len(w), "p50": round(float(np.percentile(w, 50)), 1),
                          "p95": round(float(np.percentile(w, 95)), 1), "max": round(float(w.max()), 1)}
                         if len(w) else {"n": 0})
        out["finals_overtaken_by_drafts"] = self.overtaken
        return out

    def _next(self):
        if self._running is not None or not self._queue:
            return
        job = self._running = heapq.heappop(self._queue)
        self.waits[job.priority].append(time.monotonic() - job.submitted)
        if job.priority == DRAFT:
            self._last_draft_seq = max(self._last_draft_seq, job.seq)
        elif self._last_draft_seq > job.seq:
            self.overtaken += 1
        done = self._worker.submit(self._call, job.fn)
        ioloop.IOLoop.current().add_future(done, lambda f: self._finished(job, f))

    def _call(self, fn):          # in the worker thread
        if self._model is None:
            self._load()
        return fn(self._model)

    def _finished(self, job, f):
        self._running = None
        self.last_active = time.monotonic()
        if f.exception() is not None:
            future_set_exception_unless_cancelled(job.future, f.exception())
        else:
            future_set_result_unless_cancelled(job.future, f.result())
        self._next()


def _rss():
    """The process's resident memory in bytes (Linux's /proc), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
