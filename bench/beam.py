"""Beam search (N rows per decoder call) against greedy, per 30 s window, decoder only.

    python bench/beam.py [MODEL] [--beams 5] [--device cpu|cuda] [--compute-type float32|int8] [--repeat 3]

For each clip: the encoder runs once; then greedy and beam-N decode the same window (best of
--repeat), and, for scale, N separate greedy decodes would cost N × greedy. Prints ms per window
and tokens; the ratio beam/greedy is the number to read (N beams cost far less than N decodes
when it is well under N).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nwhisper  # noqa: E402
from nwhisper import mel as M  # noqa: E402
from nwhisper.decoding import DecodingOptions  # noqa: E402
from nwhisper.io.audio import load_audio  # noqa: E402

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
CLIPS = ["jfk.wav", "espeak/en-11s.flac", "librivox/sense_and_sensibility_01_austen_64kb-0870.flac", "cards/005.wav"]


def best(f, repeat):
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = f()
        t.append(time.perf_counter() - t0)
    return min(t), r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default="tiny.en")
    p.add_argument("--beams", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compute-type", default="float32")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    m = nwhisper.load(a.model, device=a.device, compute_type=a.compute_type)
    dec = m._transcriber.decoder
    lang = "en" if m.dims.is_multilingual else None
    print(f"{a.model} {a.compute_type} on {m.backend.name}, beam {a.beams} vs greedy (decoder only, best of {a.repeat}), "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'clip':58s} {'greedy ms':>10s} {'tok':>4s} {'beam ms':>9s} {'tok':>4s} {'ratio':>6s}")
    tot_g = tot_b = 0.0
    for clip in CLIPS:
        x = load_audio(os.path.join(FIX, clip))
        enc = m.model.encode(M.log_mel(x, m.dims.n_mels, 2 * m.dims.n_audio_ctx))
        dec.decode(enc, DecodingOptions(language=lang, beam_size=a.beams))       # warm-up/compile
        tg, rg = best(lambda: dec.decode(enc, DecodingOptions(language=lang)), a.repeat)
        tb, rb = best(lambda: dec.decode(enc, DecodingOptions(language=lang, beam_size=a.beams)), a.repeat)
        tot_g, tot_b = tot_g + tg, tot_b + tb
        print(f"{clip:58s} {tg * 1e3:10.1f} {len(rg.tokens):4d} {tb * 1e3:9.1f} {len(rb.tokens):4d} {tb / tg:6.2f}")
    print(f"{'all':58s} {tot_g * 1e3:10.1f} {'':4s} {tot_b * 1e3:9.1f} {'':4s} {tot_b / tot_g:6.2f}"
          f"   ({a.beams} separate greedy decodes: ratio {a.beams:.2f})")


if __name__ == "__main__":
    main()
