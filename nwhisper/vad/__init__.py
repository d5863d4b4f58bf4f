"""Voice activity: Silero VAD on our kernels, the energy fallback, and the endpointer.

    silero.py      Silero VAD v5/v6 (16 kHz) on nwhisper.kernels.vad_ops; weights beside it (MIT)
    energy.py      the energy detector (the fallback) and a chunk's level in dBFS
    regions.py     a whole recording's speech regions (silero-vad's rule), for `transcribe --vad`
    endpointer.py  the pure state machine that cuts a stream into utterances, every 32 ms
    stream.py      a detector + an endpointer over a live stream: samples in, events out
"""

from nwhisper.vad.endpointer import Drop, End, Endpointer, EndpointerOptions, Level, Partial, Start, Stop
from nwhisper.vad.stream import VadStream, message, run

__all__ = ["Drop", "End", "Endpointer", "EndpointerOptions", "Level", "Partial", "Start", "Stop", "VadStream",
           "message", "run"]
