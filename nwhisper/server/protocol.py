"""The seed WebSocket's binary frames: audio in the format its config names, and what each is
checked for (the config message itself is a StreamSettings update: stream/settings.py).

    samples = decode_frame(frame, settings)           # float32 at settings.rate; FrameError if bad

Pure functions, no I/O: the WebSocket handler (stream.py) and the fuzz tests call them alike.
"""

from __future__ import annotations

import numpy as np

MAX_FRAME = 2 << 20          # bytes in one binary frame (65 s of 16 kHz pcm16); more is refused


class FrameError(ValueError):
    """A binary frame that is not audio in the configured format; the frame is dropped."""


def decode_frame(frame, settings):
    """A binary frame → float32 samples at settings.rate; FrameError naming what is wrong."""
    n = len(frame)
    if n > MAX_FRAME:
        raise FrameError(f"a binary frame of {n} bytes is more than this server takes "
                         f"({MAX_FRAME}); send audio in frames of a second or less")
    if settings.format == "pcm16":
        if n % 2:
            raise FrameError(f"a pcm16 frame of {n} bytes is not a whole number of 2-byte samples")
        return np.frombuffer(frame, "<i2").astype(np.float32) / np.float32(32768.0)
    if n % 4:
        raise FrameError(f"a float32 frame of {n} bytes is not a whole number of 4-byte samples")
    x = np.frombuffer(frame, "<f4").astype(np.float32)
    if not np.isfinite(x).all():
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise FrameError(f"a float32 frame holds {bad} non-finite samples (NaN or infinity); "
                         f"the frame was dropped")
    return x
