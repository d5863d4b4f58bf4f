"""Rooms of a kitchen voice device, built from fixture speech: the live stream's test and bench.

One speaker gives eight answers (cards/*.wav, forever.wav) with 2-3 s between them and 2 s of room
before the first; the same answers are then heard in four rooms:

  quiet   over -70 dBFS white noise;
  tv      a second voice (librivox and espeak readers, end to end, each at one level) 12 dB
          below the speaker's level all the way through, before the first answer too;
  music   plucked chords, four a second (each normalised, made by sox), 10 dB below the speaker;
  music5  the same music 5 dB below the speaker.

Levels are the endpointer's own measure of a speaker (the 90th percentile of 32 ms chunk
levels), so "12 dB below" is 12 dB below in the terms near_db is set in. The truth is the
construction: where each answer's voice begins and ends (fixture_audio.extent).
"""

import os
import subprocess

import numpy as np
import soundfile as sf

from fixture_audio import extent
from paths import FIXTURES

SR = 16000
ROOMS = ("quiet", "tv", "music", "music5")
ANSWERS = ["cards/001.wav", "forever.wav", "cards/002.wav", "cards/003.wav", "cards/005.wav",
           "cards/004.wav", "forever.wav", "cards/001.wav"]
GAPS_S = [2.5, 3.0, 2.0, 2.8, 2.2, 3.0, 2.4]
LEAD_S, TAIL_S = 2.0, 2.5
OTHER = ["librivox/sense_and_sensibility_01_austen_64kb-0870.flac", "espeak/en-11s.flac",
         "librivox/sense_and_sensibility_01_austen_64kb-0890.flac",
         "librivox/sense_and_sensibility_01_austen_64kb-0920.flac", "espeak/en-63s.flac"]
CHORDS = [("A3", "C4", "E4"), ("F3", "A3", "C4"), ("C3", "E3", "G3"), ("G3", "B3", "D4")]


def read(rel):
    x, sr = sf.read(os.path.join(FIXTURES, rel), dtype="float32", always_2d=True)
    assert sr == SR, rel
    return x.mean(axis=1)


def level_db(x):
    """A voice's level as the endpointer measures a speaker's: the 90th percentile of its 32 ms
    chunks' RMS in dBFS, over the chunks within 35 dB of the loudest."""
    n = 512
    db = 10 * np.log10((x[:len(x) // n * n].reshape(-1, n) ** 2).mean(1) + 1e-12)
    return float(np.percentile(db[db > db.max() - 35], 90))


def sox(*args):
    subprocess.run(["sox", *map(str, args)], check=True, stderr=subprocess.DEVNULL)


def music(work, seconds):
    """`seconds` of plucked chords (sox's pluck), four a second, a chord change every second."""
    beats = []
    for k in range(int(seconds * 4) + 1):
        f = os.path.join(work, f"beat{k % 16}.wav")
        if not os.path.exists(f):
            sox("-n", "-r", SR, "-c", 1, "-b", 16, f, "synth", 0.25,
                *[w for note in CHORDS[(k // 4) % 4] for w in ("pluck", note)], "norm", -6)
        beats.append(f)
    sox(*beats, os.path.join(work, "music-raw.wav"))
    return sf.read(os.path.join(work, "music-raw.wav"), dtype="float32")[0]


def build(work, rooms=ROOMS):
    """The rooms as 16 kHz WAVs in work/: ({room: path}, the answers' voice spans in s, the
    length in s)."""
    os.makedirs(work, exist_ok=True)
    parts, truth, t = [np.zeros(int(LEAD_S * SR), np.float32)], [], LEAD_S
    for i, rel in enumerate(ANSWERS):
        x = read(rel)
        a, b = extent(x)
        truth.append((t + a, t + b))
        parts.append(x)
        t += len(x) / SR
        gap = GAPS_S[i] if i < len(GAPS_S) else TAIL_S
        parts.append(np.zeros(int(gap * SR), np.float32))
        t += gap
    speaker = np.concatenate(parts)
    seconds = len(speaker) / SR
    level = level_db(np.concatenate([read(r) for r in sorted(set(ANSWERS))]))
    other = np.concatenate([read(r) * 10 ** ((-30 - level_db(read(r))) / 20) for r in OTHER])
    beds = {"quiet": np.random.default_rng(0).standard_normal(len(speaker)) * 10 ** (-70 / 20),
            "tv": np.resize(other, len(speaker))}
    if "music" in rooms or "music5" in rooms:
        beds["music"] = beds["music5"] = np.resize(music(work, seconds), len(speaker))
    paths = {}
    for name in rooms:
        below = {"quiet": None, "tv": 12.0, "music": 10.0, "music5": 5.0}[name]
        bed = beds[name]
        gain = 1.0 if below is None else 10 ** ((level - below - level_db(bed)) / 20)
        paths[name] = os.path.join(work, f"{name}.wav")
        sf.write(paths[name], speaker + gain * bed, SR, subtype="PCM_16")
    return paths, truth, seconds
