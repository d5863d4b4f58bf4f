"""G.711 (ITU-T, 1972): telephony's 8 kHz companded audio, one byte a sample.

    ulaw_decode(data) → float32 in [-1, 1)      μ-law (North America, Japan: "audio/pcmu")
    alaw_decode(data) → float32 in [-1, 1)      A-law (elsewhere: "audio/pcma")

Each byte holds a sign, a 3-bit segment (a power of two) and a 4-bit step within it; decoding is
a 256-entry table built from the standard's formulas, in the 16-bit scale every codec uses.
"""

from __future__ import annotations

import numpy as np


def _ulaw_table():
    u = ~np.arange(256) & 0xFF
    exponent, mantissa = (u >> 4) & 7, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table():
    a = np.arange(256) ^ 0x55
    exponent, mantissa = (a >> 4) & 7, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8,
                         ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


ULAW = _ulaw_table()          # byte → the 16-bit sample it stands for
ALAW = _alaw_table()


def _decode(table, data):
    codes = np.frombuffer(data, np.uint8)
    return table[codes].astype(np.float32) / np.float32(32768.0)


def ulaw_decode(data):
    return _decode(ULAW, data)


def alaw_decode(data):
    return _decode(ALAW, data)
