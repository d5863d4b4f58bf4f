"""nwhisper on the CUDA backend: per-token decode and warm transcription, checked against the CPU.

    python3 bench/gpu.py [--models tiny.en,base] [--device cuda] [--repeat 3]

Prepared for a session that is lent a GPU (issue 8: "the CUDA backend's per-token time and warm
request time for tiny and base"; the seed's figure to beat is 456 µs per token on whisper-tiny,
RTX 4090). Per model it prints: the load time; the encoder time per 30 s window; the median of
32 single-token decoder steps at position ~64 (vocabulary projection included, synchronised);
and, for the 11 s and 63 s clips, the warm transcription time (median of --repeat, after one
unrecorded run) with the output tokens and ms per token. Every transcript is compared with the
CPU backend's (same model, same options): the same text is the check that the GPU computes what
the CPU does; a difference is printed, not hidden.

Runs anywhere with --device cpu (that is how it was checked without a GPU). The clips are the
bench's (bench/transcribe.py --work, default /tmp/nwhisper-bench: en-11s.flac.npy, en-63s.flac.npy),
or decoded from fixtures/espeak/ when that folder is absent.

--random: no weights needed (a device machine takes at most 64 MiB with it; tiny.en alone is
75 MB): random weights in tiny.en's and base's exact shapes. It prints the encoder time, the
decoder step, and a fixed 100-token greedy "request" (no EOT is sampled from random weights:
logits with EOT suppressed), and checks the encoder states and those 100 tokens against the CPU
backend's. Needs only numpy, numba, numba-cuda, tokenizers and soundfile on the device.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import nwhisper  # noqa: E402  (before NumPy: nwhisper sets OpenBLAS's options)
import numpy as np  # noqa: E402

CLIPS = {"11": "en-11s.flac", "63": "en-63s.flac"}
STEPS, POSITION, TOKEN = 32, 64, 440


def clip(name, work):
    npy = os.path.join(work, name + ".npy")
    if os.path.exists(npy):
        return np.load(npy)
    from nwhisper.io.audio import load_audio
    return load_audio(os.path.join(os.path.dirname(HERE), "fixtures", "espeak", name))


def synced(be, fn):
    """Seconds of fn() with the device drained before and after."""
    be.sync()
    t = time.perf_counter()
    out = fn()
    be.sync()
    return time.perf_counter() - t, out


def step_ms(model):
    """Median ms of STEPS single-token decoder steps around POSITION (logits included)."""
    be, d = model.be, model.dims
    enc = model.encode(np.zeros((2 * d.n_audio_ctx, d.n_mels), np.float32))
    state = model.new_state(enc)
    model.decode(state, np.full(POSITION - STEPS // 2, TOKEN, np.int32))
    ids = be.upload(np.array([TOKEN], np.int32))
    times = [synced(be, lambda: model.decode(state, ids))[0] for _ in range(STEPS)]
    return 1e3 * statistics.median(times)


def transcribe(m, audio, repeat):
    def run():
        segs, _ = m.transcribe(audio, language="en", timestamps=True)
        return segs
    run()
    times, segs = [], None
    for _ in range(repeat):
        t, segs = synced(m.backend, run)
        times.append(t)
    text = "".join(s.text for s in segs)
    return statistics.median(times), text, sum(len(s.tokens) for s in segs)


# Dims of the real models (their config.json), for --random.
SHAPES = {"tiny.en": dict(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6,
                          n_audio_layer=4, n_vocab=51864, n_text_ctx=448, n_text_state=384,
                          n_text_head=6, n_text_layer=4),
          "base": dict(n_mels=80, n_audio_ctx=1500, n_audio_state=512, n_audio_head=8,
                       n_audio_layer=6, n_vocab=51865, n_text_ctx=448, n_text_state=512,
                       n_text_head=8, n_text_layer=6)}
N_FIXED = 100


def random_model(name, device):
    from nwhisper import backend as B
    from nwhisper.io.checkpoint import Checkpoint, Dims, expected_shapes
    from nwhisper.model import Whisper
    dims = Dims(**SHAPES[name])
    rng = np.random.default_rng(0)
    tensors = {k: (rng.standard_normal(shape) * 0.05).astype(np.float16)
               for k, shape in expected_shapes(dims).items()}
    ck = Checkpoint(dims=dims, tensors=tensors, path="<random>", container="synthetic")
    return Whisper(ck, B.get(device))


def fixed_greedy(model, enc, eot):
    """N_FIXED greedy tokens after a 3-token prompt, EOT never chosen; (tokens, seconds)."""
    be = model.be
    state = model.new_state(enc)
    logits = model.decode(state, np.array([eot + 1, eot + 2, eot + 3], np.int32), logits_for=(2,))
    tokens = []
    t = time.perf_counter()
    for _ in range(N_FIXED):
        row = be.download(logits)[0]
        row[eot] = -np.inf
        tokens.append(int(np.argmax(row)))
        logits = model.decode(state, np.array(tokens[-1:], np.int32))
    be.sync()
    return tokens, time.perf_counter() - t


def random_main(args):
    for name in args.models.split(","):
        m = random_model(name, args.device)
        be, d = m.be, m.dims
        mel = np.random.default_rng(1).standard_normal((2 * d.n_audio_ctx, d.n_mels)).astype(np.float32)
        m.encode(mel)
        enc_s = statistics.median(synced(be, lambda: m.encode(mel))[0] for _ in range(5))
        enc = m.encode(mel)
        eot = d.positional_special_ids()["<|endoftext|>"]
        tokens, dt = fixed_greedy(m, enc, eot)
        print(f"{name} (random weights) on {be.name}: encoder {1e3 * enc_s:.1f} ms/window, decoder "
              f"step {step_ms(m):.3f} ms at ~{POSITION}, {N_FIXED} greedy tokens "
              f"{1e3 * dt / N_FIXED:.3f} ms/token (host argmax), request {enc_s + dt:.3f} s",
              flush=True)
        if args.device != "cpu":
            cpu = random_model(name, "cpu")
            enc_cpu = cpu.encode(mel)
            diff = float(np.abs(be.download(enc) - enc_cpu).max())
            same = fixed_greedy(cpu, enc_cpu, eot)[0] == tokens
            print(f"  vs the CPU: encoder max |Δ| {diff:.3g}; {N_FIXED} tokens "
                  f"{'the same' if same else 'DIFFER'}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny.en,base")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default="/tmp/nwhisper-bench")
    ap.add_argument("--random", action="store_true", help="random weights in the real shapes")
    args = ap.parse_args()
    if args.random:
        return random_main(args)
    for name in args.models.split(","):
        t0 = time.perf_counter()
        m = nwhisper.load(name, device=args.device)
        load_s = time.perf_counter() - t0
        be = m.backend
        mel = np.zeros((2 * m.dims.n_audio_ctx, m.dims.n_mels), np.float32)
        m.model.encode(mel)
        enc_s = statistics.median(synced(be, lambda: m.model.encode(mel))[0] for _ in range(5))
        print(f"{name} on {be.name}: load {load_s:.2f} s, encoder {1e3 * enc_s:.1f} ms/window, "
              f"decoder step {step_ms(m.model):.3f} ms at position ~{POSITION}", flush=True)
        cpu = nwhisper.load(name, device="cpu") if args.device != "cpu" else None
        for label, file in CLIPS.items():
            audio = clip(file, args.work)
            warm, text, tokens = transcribe(m, audio, args.repeat)
            line = (f"  {label} s clip: warm {warm:.3f} s ({warm / (len(audio) / 16000):.4f} x real "
                    f"time), {tokens} tokens, {1e3 * warm / max(tokens, 1):.2f} ms/token overall")
            if cpu is not None:
                segs, _ = cpu.transcribe(audio, language="en", timestamps=True)
                ref = "".join(s.text for s in segs)
                line += ", same text as the CPU" if ref == text else \
                    f"\n    DIFFERS from the CPU:\n    {args.device}: {text!r}\n    cpu: {ref!r}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
