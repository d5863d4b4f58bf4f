"""A detector and an endpointer over a live stream: samples in, events out.

    vad = VadStream()                          # Silero if its weights are here, else energy
    for pcm in frames:                         # any length, float32 at 16 kHz
        for event in vad.feed(pcm):
            ...
    events = vad.flush()

What a WebSocket connection holds: it buffers to whole 512-sample chunks, asks the detector for
p(speech) and measures each chunk's level, and steps the endpointer once per chunk. The
endpointer's events carry times on the stream's clock (seconds since the first sample).
"""

import dataclasses

import numpy as np

from nwhisper.vad.endpointer import Endpointer, EndpointerOptions
from nwhisper.vad.energy import CHUNK, Energy, level_db


def detector(kind="auto", be=None):
    """'silero', 'energy' or 'auto' (Silero when its weights are installed)."""
    from nwhisper.vad import silero

    if kind == "energy" or (kind == "auto" and not silero.weights_available()):
        return Energy()
    if kind not in ("auto", "silero"):
        raise ValueError(f"unknown VAD {kind!r}: expected 'silero', 'energy' or 'auto'")
    return silero.Silero(be)


class VadStream:
    """Detector + endpointer for one stream."""

    def __init__(self, options=None, vad="auto", be=None, **kw):
        self.detector = vad if callable(vad) else detector(vad, be)
        self.endpointer = Endpointer(options or EndpointerOptions(), **kw)
        self._buf = np.zeros(0, np.float32)
        self.probs = []                        # p(speech) per chunk so far

    def feed(self, samples):
        """Samples (1-D float32, 16 kHz) in; the events the whole chunks among them caused."""
        buf = np.concatenate([self._buf, np.asarray(samples, np.float32).reshape(-1)])
        whole = len(buf) // CHUNK * CHUNK
        events = []
        for i in range(0, whole, CHUNK):
            chunk = buf[i:i + CHUNK]
            p = self.detector(chunk)
            self.probs.append(p)
            events += self.endpointer.step(p, level_db(chunk))
        self._buf = buf[whole:]
        return events

    def flush(self):
        """End of stream: the last partial chunk (zero-padded) and the close of what is open."""
        events = []
        if len(self._buf):
            events += self.feed(np.zeros(CHUNK - len(self._buf), np.float32))
        return events + self.endpointer.flush()

    def end(self):
        return self.endpointer.end()

    def reset(self):
        self.endpointer.reset()


def message(event):
    """An event as the WebSocket's JSON object: {"type": "start" | "partial" | "end" | "level",
    ...its fields}, times in seconds on the stream's clock."""
    fields = {k: v for k, v in dataclasses.asdict(event).items() if k != "kind"}
    return {"type": event.kind, **fields}


def run(audio, options=None, vad="auto", be=None, **kw):
    """All the events `audio` (1-D, 16 kHz) causes, as a stream would, ending with flush()."""
    s = VadStream(options, vad, be, **kw)
    return s.feed(audio) + s.flush()
