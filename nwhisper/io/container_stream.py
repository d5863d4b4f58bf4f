"""A container that arrives in pieces — a browser's MediaRecorder sending Opus in WebM, or Ogg
Opus from a phone — decoded as it comes, by FFmpeg's libraries through PyAV.

    d = ContainerStream(on_audio, on_error)   # both called on the decoding thread
    d.feed(piece)                             # bytes as they arrive, any size
    d.close()                                 # no more bytes: the rest is decoded, then it stops

on_audio(samples, rate) gets mono float32 blocks (the channels averaged, as load_audio does) at
the stream's own rate; on_error(message) gets one line when FFmpeg cannot read what came (and
decoding stops). PyAV reads from a pipe whose reads wait for the next piece, on a thread of the
stream's own, so the caller never blocks; probing is kept to the first packets (a live stream
has no end to look ahead to).
"""

from __future__ import annotations

import io
import threading

import numpy as np

from .container import _apart, _reason

PROBE_BYTES = 4096           # FFmpeg reads this much to recognise the container, then starts


class _Pipe(io.RawIOBase):
    """Bytes in from one thread, blocking reads from another; EOF once closed and drained."""

    def __init__(self):
        self._buf = bytearray()
        self._eof = False
        self._cv = threading.Condition()

    def readable(self):
        return True

    def readinto(self, b):
        with self._cv:
            while not self._buf and not self._eof:
                self._cv.wait()
            n = min(len(b), len(self._buf))
            b[:n] = self._buf[:n]
            del self._buf[:n]
            return n

    def put(self, data):
        with self._cv:
            self._buf += data
            self._cv.notify()

    def end(self):
        with self._cv:
            self._eof = True
            self._cv.notify()


class ContainerStream:
    def __init__(self, on_audio, on_error):
        self._pipe = _Pipe()
        self._on_audio, self._on_error = on_audio, on_error
        self._thread = threading.Thread(target=self._run, name="nwhisper-container", daemon=True)
        self._thread.start()

    def feed(self, piece):
        self._pipe.put(piece)

    def close(self):
        self._pipe.end()

    def join(self, timeout=None):
        self._thread.join(timeout)

    def _run(self):
        import av

        try:
            container = av.open(self._pipe, mode="r", metadata_errors="ignore",
                                options={"probesize": str(PROBE_BYTES), "analyzeduration": "0"})
        except (av.FFmpegError, ValueError, OSError) as e:
            return self._on_error(f"cannot read the stream's container: {_reason(e)}")
        try:
            if not container.streams.audio:
                return self._on_error("the stream's container holds no audio")
            stream = container.streams.audio[0]
            rate = stream.codec_context.sample_rate or stream.rate
            resampler = av.AudioResampler(format="fltp", rate=rate)     # planar float, same layout
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.error.InvalidDataError:
                    continue                  # one damaged packet: skipped, as players do
                for frame in frames:
                    for converted in resampler.resample(frame):
                        x = _apart(converted)
                        self._on_audio(x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1
                                       else np.ascontiguousarray(x[:, 0]), rate)
        except av.FFmpegError as e:
            self._on_error(f"cannot decode the stream: {_reason(e)}")
        finally:
            container.close()
