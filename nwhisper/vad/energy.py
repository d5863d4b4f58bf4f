"""The energy detector: the fallback when Silero's weights are absent or `--energy` asks for it.

It hears loudness, not a voice: p(speech) rises with how far a chunk stands above a noise floor
that it tracks itself (from the first chunk; down at once, up slowly: 3 dB a second), so a steady
fan is learned away but music or a television is not. Same interface as Silero: one 512-sample
chunk in, a number in [0, 1] out, so the endpointer takes either.
"""

import math

import numpy as np

CHUNK = 512
CHUNK_S = CHUNK / 16000

SNR_MID_DB = 9.0      # the SNR at which p = 0.5
SNR_SLOPE_DB = 1.5    # p goes 0.27 -> 0.73 over +-1.5 dB around it
RISE_DB_PER_S = 3.0   # how fast the floor may climb into a louder room
SILENCE_DB = -70.0    # below this nothing is speech, whatever the floor


def level_db(chunk):
    """RMS level of `chunk` in dBFS (full scale = 1.0); -100 for digital silence."""
    x = np.asarray(chunk, np.float32)
    power = float(np.dot(x, x)) / max(len(x), 1)
    return 10.0 * math.log10(power + 1e-10)


class Energy:
    """p(speech) of a chunk from its level above a tracked noise floor."""

    name = "energy"

    def __init__(self):
        self.reset()

    def reset(self):
        self.floor_db = None

    def __call__(self, chunk):
        db = level_db(chunk)
        if self.floor_db is None or db < self.floor_db:
            self.floor_db = db
        else:
            self.floor_db = min(db, self.floor_db + RISE_DB_PER_S * CHUNK_S)
        if db < SILENCE_DB:
            return 0.0
        snr = db - max(self.floor_db, SILENCE_DB - 10.0)
        return 1.0 / (1.0 + math.exp(-(snr - SNR_MID_DB) / SNR_SLOPE_DB))
