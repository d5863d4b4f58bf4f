"""nwhisper on the CUDA backend: per-token decode and warm transcription, checked against the CPU.

    python3 bench/gpu.py [--models tiny.en,base] [--device cuda] [--repeat 3] [--kernels] [--profile]

For a session that is lent a GPU (bench/gpu_session.sh runs it there; issue 8: "the CUDA backend's per-token time and warm
request time for tiny and base"; the seed's figure to beat is 456 µs per token on whisper-tiny,
RTX 4090). Per model it prints: the load time; the encoder time per 30 s window; the median of
32 single-token decoder steps at position ~64 (vocabulary projection included, synchronised);
and, for the 11 s and 63 s clips, the warm transcription time (median of --repeat, after one
unrecorded run) with the output tokens and ms per token. Every transcript is compared with the
CPU backend's (same model, same options): the same text is the check that the GPU computes what
the CPU does; a difference is printed, not hidden. First, the host time of one launch.
--kernels adds each kernel's count and time in an encoder pass (every launch drained, so each
includes a drained launch's cost) and in a decoder step (each kernel alone on the device, timed as a
CUDA graph of copies of it); --profile, cProfile of 32 decoder steps.

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
REPLAYS = 20  # kernel_times: copies of a launch in the graph that times it


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
    """Median ms of STEPS single-token decoder steps around POSITION (logits included), as text;
    on a backend that replays steps (a CUDA graph; the CPU's recorded calls), also without
    (be.replays off)."""
    be, d = model.be, model.dims
    enc = model.encode(np.zeros((2 * d.n_audio_ctx, d.n_mels), np.float32))
    graphs = be.replays
    medians = []
    for on in ((True, False) if graphs else (graphs,)):
        be.replays = on
        state = model.new_state(enc)   # a new state: a recording is kept per state
        model.decode(state, np.full(POSITION - STEPS // 2, TOKEN, np.int32))
        ids = np.array([TOKEN], np.int32)
        times = [synced(be, lambda: model.decode(state, ids))[0] for _ in range(STEPS)]
        medians.append(1e3 * statistics.median(times))
    be.replays = graphs
    if graphs:
        return f"{medians[0]:.3f} ms (replayed; {medians[1]:.3f} ms launched one by one)"
    return f"{medians[0]:.3f} ms"


def launch_us(be, n=2000):
    """Host µs per launch of a one-element kernel, and per launch including its completion."""
    from nwhisper.kernels.elementwise import fill_elem
    a = be.empty((1,), np.float32)
    be.launch(fill_elem, 1, a, np.float32(0))
    async_s = synced(be, lambda: [be.launch(fill_elem, 1, a, np.float32(0)) for _ in range(n)])[0]
    sync_s = synced(be, lambda: [(be.launch(fill_elem, 1, a, np.float32(0)), be.sync()) for _ in range(n)])[0]
    print(f"{be.name}: a one-element launch costs {1e6 * async_s / n:.1f} µs of host time, "
          f"{1e6 * sync_s / n:.1f} µs waited for", flush=True)


def kernel_name(kernel, grid, block, *args):
    n = kernel.py_func.__name__
    return f"{n} {args[0].shape}x{args[1].shape}" if n in ("gemv", "gemm_tiled") else n


def print_totals(label, totals, top):
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])
    print(f"  {label}: {sum(c for c, _ in totals.values())} launches, "
          f"{1e3 * sum(t for _, t in totals.values()):.3f} ms", flush=True)
    for name, (count, secs) in rows[:top]:
        print(f"    {1e3 * secs:8.3f} ms {count:5d}x  {name}", flush=True)


def kernel_times(model, top=12):
    """Per kernel, the count and the summed time, for one encoder pass (each launch with the
    device drained around it: its time includes a drained launch's ~20 µs) and one decoder step
    (each launch timed on the device alone: a CUDA graph of REPLAYS copies of it, replayed)."""
    be, d = model.be, model.dims
    if not hasattr(be, "run"):
        print("  (per-kernel times: the CUDA backend only)")
        return
    plain, graphs = be.run, be.replays
    totals, launches = {}, []

    def drained(kernel, grid, block, *args):
        be.sync()
        t = time.perf_counter()
        plain(kernel, grid, block, *args)
        be.sync()
        c = totals.setdefault(kernel_name(kernel, grid, block, *args), [0, 0.0])
        c[0] += 1
        c[1] += time.perf_counter() - t

    be.replays = False   # launches one by one
    try:
        mel = np.zeros((2 * d.n_audio_ctx, d.n_mels), np.float32)
        enc = model.encode(mel)
        be.run = drained
        model.encode(mel)
        print_totals("encoder, launches drained one by one", totals, top)
        state = model.new_state(enc)
        model.decode(state, np.full(POSITION, TOKEN, np.int32))
        be.run = lambda kernel, grid, block, *args: (launches.append((kernel, grid, block, args)),
                                                     plain(kernel, grid, block, *args))
        model.decode(state, np.array([TOKEN], np.int32))
    finally:
        be.run, be.replays = plain, graphs
    if not hasattr(plain, "capture"):
        return
    totals.clear()
    for kernel, grid, block, args in launches:
        _, graph = plain.capture(lambda: [plain(kernel, grid, block, *args) for _ in range(REPLAYS)])
        plain.replay(graph)
        seconds = synced(be, lambda: plain.replay(graph))[0] / REPLAYS
        c = totals.setdefault(kernel_name(kernel, grid, block, *args), [0, 0.0])
        c[0] += 1
        c[1] += seconds
    print_totals("decoder step, each kernel on the device alone", totals, top)


def profile_step(model, top=14):
    """Where one decoder step's host time goes: launches per step, then cProfile's top functions
    by own time over STEPS steps (a GPU step is bound by Python and launch overhead until proved
    otherwise)."""
    import cProfile
    import pstats
    be, d = model.be, model.dims
    if not hasattr(be, "run"):
        print("  (the launch count: the CUDA backend only)")
    state = model.new_state(model.encode(np.zeros((2 * d.n_audio_ctx, d.n_mels), np.float32)))
    model.decode(state, np.full(POSITION - STEPS // 2, TOKEN, np.int32))
    ids = np.array([TOKEN], np.int32)
    if hasattr(be, "run"):
        launches = []
        plain = be.run
        be.run = lambda kernel, *a: (launches.append(kernel.py_func.__name__), plain(kernel, *a))[1]
        model.decode(state, ids)
        be.run = plain
        print(f"  one decoder step: {len(launches)} launches ({', '.join(sorted(set(launches)))})",
              flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(STEPS):
        model.decode(state, ids)
    be.sync()
    prof.disable()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def transcribe(m, audio, repeat, profile=False, top=16):
    """(median warm seconds, text, tokens); with `profile`, then cProfile's top functions by
    own time in one more transcription (what the host does around the device's work)."""
    def run():
        segs, _ = m.transcribe(audio, language="en", timestamps=True)
        segs = list(segs)
        return segs
    run()
    times, segs = [], None
    for _ in range(repeat):
        t, segs = synced(m.backend, run)
        times.append(t)
    if profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        synced(m.backend, run)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)
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
    """N_FIXED greedy tokens after a 3-token prompt, EOT never chosen, each picked on the device
    as decoding does (kernels/pick.py: two floats come back); (tokens, seconds of the last
    N_FIXED - 1: the first step is left out of the time, as it may compile kernels for a
    one-row step's array layouts, which a prompt's rows do not have)."""
    from nwhisper import kernels as K
    be, n_vocab = model.be, model.dims.n_vocab
    mask = np.zeros((1, n_vocab), np.float32)
    mask[0, eot] = -np.inf
    mask, choice = be.upload(mask), be.empty((2,), np.float32)
    rules = be.upload(np.array([0, n_vocab, n_vocab, 0], np.int32))  # every id as text, no rule 5
    state = model.new_state(enc)
    logits = model.decode(state, np.array([eot + 1, eot + 2, eot + 3], np.int32), logits_for=(2,))
    tokens = []
    for i in range(N_FIXED):
        if i == 1:
            be.sync()
            t = time.perf_counter()
        K.pick(be, logits, mask, rules, n_vocab, choice)
        tokens.append(int(be.download(choice)[0]))
        logits = model.decode(state, np.array(tokens[-1:], np.int32))
    be.sync()
    return tokens, (time.perf_counter() - t) * N_FIXED / (N_FIXED - 1)


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
              f"step {step_ms(m)} at ~{POSITION}, {N_FIXED} greedy tokens "
              f"{1e3 * dt / N_FIXED:.3f} ms/token (picked on the device), request {enc_s + dt:.3f} s",
              flush=True)
        if args.kernels:
            kernel_times(m)
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
    ap.add_argument("--profile", action="store_true", help="cProfile STEPS decoder steps per model")
    ap.add_argument("--kernels", action="store_true", help="time each kernel of an encoder pass and a decoder step")
    args = ap.parse_args()
    from nwhisper import backend as B
    launch_us(B.get(args.device))
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
              f"decoder step {step_ms(m.model)} at position ~{POSITION}", flush=True)
        if args.kernels:
            kernel_times(m.model)
        if args.profile:
            profile_step(m.model)
        cpu = nwhisper.load(name, device="cpu") if args.device != "cpu" else None
        for label, file in CLIPS.items():
            audio = clip(file, args.work)
            warm, text, tokens = transcribe(m, audio, args.repeat, args.profile and label == "11")
            line = (f"  {label} s clip: warm {warm:.3f} s ({warm / (len(audio) / 16000):.4f} x real "
                    f"time), {tokens} tokens, {1e3 * warm / max(tokens, 1):.2f} ms/token overall")
            if cpu is not None:
                segs, _ = cpu.transcribe(audio, language="en", timestamps=True)
                segs = list(segs)
                ref = "".join(s.text for s in segs)
                line += ", same text as the CPU" if ref == text else \
                    f"\n    DIFFERS from the CPU:\n    {args.device}: {text!r}\n    cpu: {ref!r}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
