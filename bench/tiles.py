"""The decoder's products of a few rows: linear_elem (the portable body) against linear_tiles.

    python3 bench/tiles.py [--model tiny.en] [--rows 1,2,5,8] [--repeat 100]

For each weight type the decoder keeps (int8 rows, float16 bits), each of the model's decoder
shapes (the logits, fc1, fc2) and each row count (a window; a beam or a batch of windows), on
random values: the 25th percentile of --repeat calls of each, both shared out on the threads as
the backend does (parallel), and whether the two outputs are the same bits. The logits stream from
memory (20 MB of int8, 40 MB of float16 for tiny.en); fc1 and fc2 stay in cache.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nwhisper.backend import get  # noqa: E402
from nwhisper.kernels import linear_tiles  # noqa: E402
from nwhisper.kernels.matmul import linear_elem  # noqa: E402

WIDTHS = {"tiny.en": (384, 51864), "base.en": (512, 51864), "small.en": (768, 51864)}


def timed(f, repeat):
    f()
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return float(np.percentile(t, 25)) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny.en", choices=sorted(WIDTHS))
    p.add_argument("--rows", default="1,2,5,8")
    p.add_argument("--repeat", type=int, default=100)
    a = p.parse_args()
    if not linear_tiles.available():
        sys.exit("linear_tiles does not run on this CPU (it needs AVX2, FMA and F16C)")
    d, vocab = WIDTHS[a.model]
    rng, be = np.random.default_rng(0), get("cpu")
    print(f"{a.model} decoder products, ms (25th percentile of {a.repeat}); load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'weights':8s} {'shape':>12s} {'rows':>4s} {'linear_elem':>12s} {'linear_tiles':>13s} "
          f"{'ratio':>6s}  same")
    for kind in ("int8", "float16"):
        for name, (n_out, n_in) in (("logits", (vocab, d)), ("fc1", (4 * d, d)), ("fc2", (d, 4 * d))):
            if kind == "int8":
                w = rng.integers(-127, 128, (n_out, n_in)).astype(np.int8)
                scale = rng.random(n_out).astype(np.float32)
            else:
                w = rng.standard_normal((n_out, n_in)).astype(np.float16).view(np.uint16)
                scale = np.ones(n_out, np.float32)
            bias = np.zeros(n_out, np.float32)
            none = np.zeros(0, np.float32)
            for n in (int(r) for r in a.rows.split(",")):
                x = rng.standard_normal((n, n_in)).astype(np.float32)
                body, tiles = np.empty((n, n_out), np.float32), np.empty((n, n_out), np.float32)
                t_body = timed(lambda: be.share(be._launcher(linear_elem, "_range"), n_out,
                                                x, w, scale if kind == "int8" else none, none, body,
                                                n, n_in, False), a.repeat)
                t_tiles = timed(lambda: be.share(linear_tiles.linear_range, linear_tiles.items(n_out),
                                                 x, w, scale, bias, tiles, 0),
                                a.repeat)
                print(f"{kind:8s} {f'{n_out}x{n_in}':>12s} {n:4d} {t_body:12.3f} {t_tiles:13.3f} "
                      f"{t_tiles / t_body:6.2f}  {np.array_equal(body, tiles)}")


if __name__ == "__main__":
    main()
