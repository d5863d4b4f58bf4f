"""End-to-end transcription on the CPU: nwhisper (float32 and int8) against faster-whisper, whisper.cpp,
openai-whisper and transformers, on the same weights, the same audio and the same thread count.

    python3 bench/transcribe.py                       # tiny.en + base, 11 s and 63 s clips, 3 rounds
    python3 bench/transcribe.py --quick               # 11 s clip, 1 round, 2 repeats: a few minutes
    python3 bench/transcribe.py --rev HEAD --profile  # bench a snapshot of a commit; cProfile us

nwhisper runs in this interpreter's environment; the peers run in the oracle venv (--peer-python,
default .oracle/bin/python; docs/ORACLES.md says how to make it). Every
system gets the model package's own CT2 weights: the CT2 directory itself (faster-whisper fp32,
and int8 quantised at load), converted by nwhisper to a Hugging Face directory (transformers), a
ggml file (whisper.cpp) and an OpenAI .pt (openai-whisper, built from the HF checkpoint with
nwhisper.io.ggml's OpenAI<->HF name table). Converted files are kept in --work between runs.

Settings, the same for everyone: 2 threads (NUMBA_NUM_THREADS / OMP / MKL / OPENBLAS = 2,
cpu_threads=2, n_threads=2, torch.set_num_threads(2)), greedy, temperature 0 with no fallback,
timestamps on (the peers' default long-form mode; nwhisper's clips <= 30 s are short-form without
timestamps unless timestamps=True, so it is called with timestamps=True), conditioning on the
previous window's text, no VAD, language "en". All get the same 16 kHz float32 samples (decoded
once by nwhisper.io.audio and saved as .npy), so file decoding is not timed.

Each measurement is one fresh subprocess per system (so its peak RSS is its own), which:
  imports, loads the model, transcribes once (the cold run; it also warms every cache),
  transcribes `--repeats` more times (warm; the median is reported), then once more with the
  encoder and the decoder instrumented (forward hooks / wrappers / whisper.cpp's own timings).
Systems are interleaved inside each round (their order rotates) and rounds repeat; the tables
give medians over rounds. A round 0 that is not recorded warms the OS page cache and Numba's
on-disk kernel cache first.

Systems: nwhisper (float32, the reference), nwhisper-int8 (compute_type="int8": int8 weights),
fw-f32, fw-int8 (faster-whisper), whisper.cpp, openai, transformers. Every ratio in a table is
against nwhisper float32, nwhisper int8's included, so any two columns compare through their
ratios; a line under each table puts the int8 decoders side by side (fw int8 / nwhisper int8).

Rows (ratio = system / nwhisper, so > 1 means nwhisper is faster or smaller):
  cold command s      spawn of the python process -> first transcript in hand (interpreter start,
                      imports, model load, first transcription; nwhisper: Numba's kernels load from
                      a warm on-disk cache)
  import+load s       inside that process: imports and model load only
  warm transcribe s   median of the warm repeats
  encoder s/window    the encoder's time per 30 s window inside a transcription
  decode ms/token     (total - encoder time) / tokens of the instrumented transcription: all
                      but the encoder (mel, prompt, decoder steps, logit rules, segmenting), per
                      output token; one method for all
  decoder step ms     one single-token decoder forward incl. the vocabulary projection, timed
                      directly where it can be (nwhisper: Whisper.decode; torch: forward hooks;
                      whisper.cpp: its "decode" timing; CTranslate2: not separable, n/a)
  peak RSS MiB        ru_maxrss of the subprocess at its end
  tokens              output tokens (text + timestamps) summed over segments; windows: encoder calls
  warm spread         (max - min) / median of the warm repeats used
  quiet runs          runs during which other processes took <= --max-foreign cores / all runs;
                      medians use the quiet ones only, unless there are none
  words != nwhisper   word edits between the transcript and nwhisper float32's (lower case, no
                      punctuation); for nwhisper int8, what its int8 weights change
A child during which other processes took more than --max-foreign cores is run again (this
machine has 2 cores: a neighbour on one of them stalls every parallel region of a 2-thread run).
Every child's result is appended to a raw .jsonl in --work as it comes: `--resume FILE` reruns
only what that file lacks (same options), then prints the tables.
Above the tables: bench/roofline.py's summary for the models benched (sgemm peak, memory bandwidth,
the encoder's share of that peak, the decoder step against its bandwidth bound), run once after
the rounds (--no-roofline skips it).
Below the tables: nwhisper's first-ever cold run (empty Numba cache: every kernel compiles), the
load average and the CPU time other processes took while the children ran ("foreign cores").
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from machine import ROOT, THREADS, THREAD_VARS, cpu_flags
CLIPS = {"11": "fixtures/espeak/en-11s.flac", "63": "fixtures/espeak/en-63s.flac"}
SYSTEMS = ["nwhisper", "nwhisper-int8", "fw-f32", "fw-int8", "whisper.cpp", "openai", "transformers"]
LABEL = {"nwhisper": "nwhisper", "nwhisper-int8": "nwhisper int8", "fw-f32": "fw fp32", "fw-int8": "fw int8",
         "whisper.cpp": "whisper.cpp", "openai": "openai-wh", "transformers": "HF"}
INT8_PEERS = ["fw-int8"]    # peers decoding with int8 weights: also set beside nwhisper-int8

# ---------------------------------------------------------------------------------------------
# The child: one system, one model, one clip. Runs under nwhisper's interpreter (system python)
# or the peers' venv; prints one JSON line. Peers' code must not import nwhisper.
CHILD = r'''
import json, os, sys, time
A = json.loads(sys.argv[1])
import resource, statistics
T0 = time.time()
SYSTEM, LANG, THREADS = A["system"], A["language"], A["threads"]
if SYSTEM.startswith("nwhisper"):  # before NumPy, as in the `nwhisper` command: nwhisper
    sys.path.insert(0, A["src"])    # sets OpenBLAS's options, which it reads when it loads
    import nwhisper
import numpy as np
audio = None
enc_t, step_t, calls = [], [], {"enc": 0}
extra = {}


def tock(t):
    return time.perf_counter() - t


if SYSTEM.startswith("nwhisper"):
    m = nwhisper.load(A["model"], device="cpu", compute_type="int8" if SYSTEM == "nwhisper-int8" else "float32")
    T_LOADED = time.time()
    audio = np.load(A["npy"])

    def run():
        segs, info = m.transcribe(audio, language=LANG, timestamps=True)
        segs = list(segs)
        return "".join(s.text for s in segs), sum(len(s.tokens) for s in segs)

    def instrument():
        model = m.model
        enc0, dec0 = model.encode, model.decode

        def encode(mel, *args, **kw):
            t = time.perf_counter(); r = enc0(mel, *args, **kw); enc_t.append(tock(t)); return r

        def decode(state, ids, **kw):
            t = time.perf_counter(); r = dec0(state, ids, **kw)
            if len(ids) == 1:
                step_t.append(tock(t))
            return r
        model.encode, model.decode = encode, decode

elif SYSTEM.startswith("fw"):
    from faster_whisper import WhisperModel
    m = WhisperModel(A["ct2"], device="cpu", compute_type="int8" if SYSTEM == "fw-int8" else "float32",
                     cpu_threads=THREADS, num_workers=1)
    T_LOADED = time.time()
    audio = np.load(A["npy"])

    def run():
        segs, info = m.transcribe(audio, language=LANG, beam_size=1, best_of=1, temperature=0.0,
                                  condition_on_previous_text=True, vad_filter=False,
                                  without_timestamps=False)
        segs = list(segs)
        return "".join(s.text for s in segs), sum(len(s.tokens) for s in segs)

    def instrument():
        enc0 = m.encode

        def encode(features):
            t = time.perf_counter(); r = enc0(features); enc_t.append(tock(t)); return r
        m.encode = encode

elif SYSTEM == "whisper.cpp":
    import _pywhispercpp as pw
    from pywhispercpp.model import Model
    # no_context=True clears the text carried over from the previous whisper_full() call (each
    # call starts fresh, as every other system's does); windows inside a call still condition on
    # the previous window's text (n_max_text_ctx), which is what whisper-cli does by default.
    m = Model(A["ggml"], n_threads=THREADS, language=LANG, no_context=True, temperature=0.0,
              temperature_inc=0.0, print_progress=False, print_realtime=False,
              redirect_whispercpp_logs_to=None)
    T_LOADED = time.time()
    audio = np.load(A["npy"])
    instrumented = [False]

    def run():
        if instrumented[0]:
            pw.whisper_reset_timings(m._ctx)
        segs = m.transcribe(audio)
        n = sum(pw.whisper_full_n_tokens(m._ctx, i) for i in range(len(segs)))
        if instrumented[0]:       # whisper_print_timings writes to fd 2: catch it in a file
            import tempfile
            sys.stderr.flush()
            with tempfile.TemporaryFile("w+") as f:
                saved = os.dup(2); os.dup2(f.fileno(), 2)
                try:
                    pw.whisper_print_timings(m._ctx)
                finally:
                    os.dup2(saved, 2); os.close(saved)
                f.seek(0); text = f.read()
            import re
            for key, ms, runs in re.findall(r"(\w+) time =\s*([\d.]+) ms /\s*(\d+) runs", text):
                extra[key] = [float(ms) / 1e3, int(runs)]
            if "encode" in extra:
                s, k = extra["encode"]
                enc_t.extend([s / max(k, 1)] * k)
            if "decode" in extra:
                s, k = extra["decode"]
                step_t.extend([s / max(k, 1)] * k)
        return "".join(s.text for s in segs), n

    def instrument():
        instrumented[0] = True

elif SYSTEM in ("openai", "transformers"):
    import torch
    torch.set_num_threads(THREADS)
    if SYSTEM == "openai":
        import whisper
        m = whisper.load_model(A["pt"], device="cpu")
        T_LOADED = time.time()
        audio = np.load(A["npy"])

        def run():
            r = whisper.transcribe(m, audio, language=LANG, temperature=0.0, fp16=False, verbose=None,
                                   condition_on_previous_text=True, without_timestamps=False)
            return r["text"], sum(len(s["tokens"]) for s in r["segments"])

        enc_mod, dec_mod = m.encoder, m.decoder

        def is_step(args, kwargs):
            return args[0].shape[-1] == 1
    else:
        from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration
        fe = WhisperFeatureExtractor.from_pretrained(A["hf"])
        tok = AutoTokenizer.from_pretrained(A["hf"])
        m = WhisperForConditionalGeneration.from_pretrained(A["hf"], dtype=torch.float32).eval()
        T_LOADED = time.time()
        audio = np.load(A["npy"])
        kw = {"language": LANG, "task": "transcribe"} if m.generation_config.is_multilingual else {}
        eot = m.generation_config.eos_token_id

        def run():
            if len(audio) > 480000:
                f = fe(audio, sampling_rate=16000, return_tensors="pt", truncation=False,
                       padding="longest", return_attention_mask=True)
                extra_kw = {"attention_mask": f.attention_mask}
            else:
                f = fe(audio, sampling_rate=16000, return_tensors="pt")
                extra_kw = {}
            with torch.inference_mode():
                out = m.generate(f.input_features, do_sample=False, num_beams=1, temperature=0.0,
                                 return_timestamps=True, condition_on_prev_tokens=True,
                                 return_dict_in_generate=True, return_segments=True, **extra_kw, **kw)
            segs = out["segments"][0]
            ids = [t for s in segs for t in s["tokens"].tolist()]
            text = tok.decode([t for t in ids if t < eot], skip_special_tokens=True)
            return text, len(ids)

        enc_mod, dec_mod = m.model.encoder, m      # m.forward: decoder + vocabulary projection

        def is_step(args, kwargs):
            ids = kwargs.get("decoder_input_ids")
            return ids is not None and ids.shape[-1] == 1

    def instrument():
        started = {}

        def pre(name, fn=None):
            def hook(mod, args, kwargs):
                started[name] = (time.perf_counter(), fn(args, kwargs) if fn else True)
            return hook

        def post(name, sink):
            def hook(mod, args, kwargs, out):
                t, keep = started.pop(name)
                if keep:
                    sink.append(tock(t))
            return hook
        enc_mod.register_forward_pre_hook(pre("enc"), with_kwargs=True)
        enc_mod.register_forward_hook(post("enc", enc_t), with_kwargs=True)
        dec_mod.register_forward_pre_hook(pre("dec", is_step), with_kwargs=True)
        dec_mod.register_forward_hook(post("dec", step_t), with_kwargs=True)
else:
    raise SystemExit(f"unknown system {SYSTEM}")

t = time.perf_counter()
text, tokens = run()
first = tock(t)
T_FIRST = time.time()
warm = []
for _ in range(A["repeats"]):
    t = time.perf_counter()
    run()
    warm.append(tock(t))
res = {"t0": T0, "t_loaded": T_LOADED, "t_first": T_FIRST, "first": first, "warm": warm,
       "text": text, "tokens": tokens}
if A["repeats"]:
    instrument()
    t = time.perf_counter()
    res["instr_text"], res["instr_tokens"] = run()
    res["instrumented"] = tock(t)
    res["enc"] = enc_t
    res["steps"] = len(step_t)
    res["step"] = statistics.median(step_t) if step_t else None
    res["extra"] = extra
res["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH-JSON " + json.dumps(res))
'''

# OpenAI .pt from the converted HF checkpoint (runs in the peers' venv)
MAKE_PT = r'''
import json, sys, torch
from safetensors.torch import load_file
hf, names, dims, out = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4]
sd = load_file(hf + "/model.safetensors")
state = {names[k]: v for k, v in sd.items() if k in names}
torch.save({"dims": dims, "model_state_dict": state}, out)
print(len(state), "tensors")
'''


# ---------------------------------------------------------------------------------------------
def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def cpu_stat():
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle, iowait, steal = f[3], f[4], f[7] if len(f) > 7 else 0
    return (sum(f[:8]) - idle - iowait - steal) / hz, steal / hz


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def wait_quiet(threshold, max_wait):
    t0 = time.time()
    while True:
        la = loadavg()
        if la < threshold or time.time() - t0 >= max_wait:
            return la, time.time() - t0
        print(f"  load {la:.2f} >= {threshold}: waiting ({time.time() - t0:.0f} s so far)", flush=True)
        time.sleep(15)


def ct2_dir(name, path):
    """The CTranslate2 directory faster-whisper loads, from the installed model package of
    `name` (its split model.bin joined); nwhisper must be importable."""
    from nwhisper.io.registry import resolve

    os.makedirs(path)
    src = resolve(name)
    meta = src.meta_dir or src.path
    for f in sorted(os.listdir(meta)):
        if f.endswith((".json", ".txt")):
            os.symlink(os.path.join(meta, f), os.path.join(path, f))
    with open(os.path.join(path, "model.bin"), "wb") as out:
        for p in (list(src.parts) or [os.path.join(src.path, "model.bin")]):
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)


def prepare(args, models, clips):
    """Convert each model for each peer once (kept in args.work); decode the clips to .npy."""
    sys.path.insert(0, args.src)
    from nwhisper.io.audio import load_audio
    from nwhisper.io.convert import convert
    from nwhisper.io.ggml import to_openai_name
    from nwhisper.io.registry import load_checkpoint

    files = {}
    for name in models:
        d = os.path.join(args.work, name)
        done = os.path.join(d, "DONE")
        paths = {"ct2": os.path.join(d, "ct2"), "hf": os.path.join(d, "hf"),
                 "ggml": os.path.join(d, "model.ggml.bin"), "pt": os.path.join(d, "openai.pt")}
        files[name] = paths
        if os.path.exists(done):
            continue
        print(f"preparing {name} in {d}", flush=True)
        shutil.rmtree(d, ignore_errors=True)
        ct2_dir(name, paths["ct2"])
        convert(name, paths["hf"], to="hf")
        hf_dir_fixups(paths["hf"])
        convert(name, paths["ggml"], to="ggml")
        ck = load_checkpoint(paths["hf"])
        dims = {k: int(v) for k, v in dataclasses.asdict(ck.dims).items()}
        names = {k: to_openai_name(k) for k in ck.tensors if to_openai_name(k)}
        with open(os.path.join(d, "openai-names.json"), "w") as f:
            json.dump(names, f)
        with open(os.path.join(d, "openai-dims.json"), "w") as f:
            json.dump(dims, f)
        r = sh([args.peer_python, "-c", MAKE_PT, paths["hf"], os.path.join(d, "openai-names.json"),
                os.path.join(d, "openai-dims.json"), paths["pt"]])
        if r.returncode:
            print(f"  openai .pt not built: {r.stderr.strip().splitlines()[-1:]}")
        open(done, "w").close()
    npys = {}
    for c in clips:
        npy = os.path.join(args.work, os.path.basename(CLIPS[c]) + ".npy")
        if not os.path.exists(npy):
            import numpy as np
            np.save(npy, load_audio(os.path.join(ROOT, CLIPS[c])))
        npys[c] = npy
    return files, npys


def hf_dir_fixups(hf_dir):
    """As fixtures/make_golden_models.py: no lang_to_id/task_to_id for an English-only model
    (transformers would take it for multilingual)."""
    path = os.path.join(hf_dir, "generation_config.json")
    with open(path, encoding="utf-8") as f:
        gen = json.load(f)
    if not gen.get("is_multilingual") and any(k in gen for k in ("lang_to_id", "task_to_id")):
        for k in ("lang_to_id", "task_to_id"):
            gen.pop(k, None)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(gen, f, indent=2)


def child_env(numba_cache):
    env = dict(os.environ)
    env.update({k: str(THREADS) for k in THREAD_VARS})
    env["NUMBA_CACHE_DIR"] = numba_cache
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    return env


def busy_cores(seconds=1.0):
    """CPU the machine spends (in cores) over `seconds` while this process sleeps."""
    b0, _ = cpu_stat()
    time.sleep(seconds)
    return (cpu_stat()[0] - b0) / seconds


def settle(args):
    """Wait until the machine is quiet for a second (other processes < --max-foreign cores), at most
    --max-wait seconds."""
    t0 = time.time()
    while busy_cores() > args.max_foreign and time.time() - t0 < args.max_wait:
        time.sleep(4)


def run_child(args, system, model, clip, files, npys, repeats, numba_cache, retry=True):
    """One child, once the machine is quiet (settle); when other processes took more than
    --max-foreign cores during it, run it again (up to --attempts times in all; the last one is
    kept). retry=False: no waiting, no second run."""
    for attempt in range(1, args.attempts + 1):
        if retry:
            settle(args)
        r = _run_child(args, system, model, clip, files, npys, repeats, numba_cache)
        r["attempts"] = attempt
        if "error" in r or r["foreign"] <= args.max_foreign or not retry:
            return r
        print(f"    ({system}: {r['foreign']:.2f} foreign cores during the run"
              f"{'; again' if attempt < args.attempts else '; kept'})", flush=True)
    return r


def _run_child(args, system, model, clip, files, npys, repeats, numba_cache):
    a = {"system": system, "model": model, "language": "en", "threads": THREADS, "npy": npys[clip],
         "repeats": repeats, "src": args.src, "ct2": files[model]["ct2"], "hf": files[model]["hf"],
         "ggml": files[model]["ggml"], "pt": files[model]["pt"]}
    py = sys.executable if system.startswith("nwhisper") else args.peer_python
    la = loadavg()
    busy0, steal0 = cpu_stat()
    ch0 = children_cpu()
    spawn = time.time()
    r = sh([py, "-c", CHILD, json.dumps(a)], env=child_env(numba_cache), cwd=ROOT,
           timeout=args.child_timeout)
    wall = time.time() - spawn
    busy1, steal1 = cpu_stat()
    own = children_cpu() - ch0
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("BENCH-JSON ")), None)
    if r.returncode or line is None:
        tail = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return {"error": f"rc {r.returncode}: {tail[:200]}"}
    res = json.loads(line[len("BENCH-JSON "):])
    res["cold"] = res["t_first"] - spawn
    res["import_load"] = res["t_loaded"] - spawn
    res["foreign"] = max(0.0, (busy1 - busy0) - own) / wall
    res["steal"] = (steal1 - steal0) / wall
    res["load"] = la
    return res


# ---------------------------------------------------------------------------------------------
def words(text):
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def word_edits(a, b):
    """The fewest word substitutions, deletions and insertions turning text a into b (WER's
    numerator, as jiwer counts it). A Levenshtein table, a row at a time: difflib's matching
    blocks are not the fewest edits, and on repeated material (a clip heard twice) they paired
    one copy with the other and counted a few changed words as hundreds."""
    import numpy as np   # here: the parent process leaves NumPy (and OpenBLAS) to the children

    ids = {}
    x = [ids.setdefault(w, len(ids)) for w in words(a)]
    y = np.array([ids.setdefault(w, len(ids)) for w in words(b)], np.int64)
    at = np.arange(len(y) + 1)
    row = at.copy()
    for i, w in enumerate(x, 1):
        best = np.empty_like(row)
        best[0] = i
        best[1:] = np.minimum(row[1:] + 1, row[:-1] + (y != w))     # deletion, substitution
        row = np.minimum.accumulate(best - at) + at                # then insertions along the row
    return int(row[-1])


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(runs, max_foreign):
    """Medians over rounds of one system's runs on one model/clip."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"] if runs else "not run"}
    clean = [r for r in ok if r["foreign"] <= max_foreign]
    n_clean, n_ok = len(clean), len(ok)
    ok = clean or ok       # runs another process disturbed count only when there is nothing else
    enc_windows = [len(r["enc"]) for r in ok]
    s = {"cold": med([r["cold"] for r in ok]),
         "import_load": med([r["import_load"] for r in ok]),
         "warm": med([med(r["warm"]) for r in ok]),
         "enc": med([sum(r["enc"]) / len(r["enc"]) if r["enc"] else None for r in ok]),
         "step": med([r["step"] * 1e3 if r.get("step") else None for r in ok]),
         "rss": med([r["rss_mib"] for r in ok]),
         "tokens": ok[-1]["tokens"], "windows": enc_windows[-1], "text": ok[-1]["text"],
         "n": len(ok), "spread": None, "clean": f"{n_clean}/{n_ok}"}
    per_tok = []        # from the instrumented transcription: its own total and encoder time
    for r in ok:
        n = r.get("instr_tokens", r["tokens"])
        if r["enc"] and n:
            per_tok.append((r["instrumented"] - sum(r["enc"])) / n * 1e3)
    s["per_token"] = med(per_tok)
    warms = [w for r in ok for w in r["warm"]]
    if len(warms) > 1:
        s["spread"] = (max(warms) - min(warms)) / statistics.median(warms)
    return s


ROWS = [("cold command s", "cold", "{:.2f}", True), ("import+load s", "import_load", "{:.2f}", True),
        ("warm transcribe s", "warm", "{:.3f}", True), ("encoder s/window", "enc", "{:.3f}", True),
        ("decode ms/token", "per_token", "{:.1f}", True), ("decoder step ms", "step", "{:.1f}", True),
        ("peak RSS MiB", "rss", "{:.0f}", True), ("tokens / windows", None, None, False),
        ("warm spread", "spread", "{:.0%}", False), ("quiet runs", "clean", "{}", False),
        ("words != nwhisper", None, None, False)]


def table(title, summ, systems):
    base = summ.get("nwhisper", {})
    w0, w = 19, 17
    out = [title, f"{'':{w0}}" + "".join(f"{LABEL[s]:>{w}}" for s in systems)]
    for label, key, fmt, ratio in ROWS:
        cells = []
        for s in systems:
            v = summ.get(s, {})
            if "error" in v:
                cells.append("error")
                continue
            if key is None and label.startswith("tokens"):
                cells.append(f"{v['tokens']} / {v['windows']}")
                continue
            if key is None:
                cells.append("-" if s == "nwhisper" else
                             str(word_edits(base["text"], v["text"])) if "text" in base else "n/a")
                continue
            x = v.get(key)
            if x is None:
                cells.append("n/a")
                continue
            c = fmt.format(x)
            b = base.get(key)
            if ratio and s != "nwhisper" and b:
                c += f" ({x / b:.2f}x)"
            cells.append(c)
        # a space before every cell, so one that overflows its width still stands apart
        out.append(f"{label:{w0}}" + "".join(f" {c:>{w - 1}}" for c in cells))
    mine = summ.get("nwhisper-int8", {})
    for s in INT8_PEERS:
        peer = summ.get(s, {})
        if s in systems and "nwhisper-int8" in systems and "error" not in peer and "error" not in mine:
            out.append(f"int8 against int8, {LABEL[s]} / nwhisper int8: " + ", ".join(
                f"{label} {peer[key] / mine[key]:.2f}x" for label, key, _, ratio in ROWS
                if ratio and peer.get(key) and mine.get(key)))
    for s in systems:
        if "error" in summ.get(s, {}):
            out.append(f"  {LABEL[s]}: {summ[s]['error']}")
    return "\n".join(out)


def header(args, systems):
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = cpu_flags()
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    mem = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal")).split()[1]) / 2**20
    rev = sh(["git", "-C", args.src, "rev-parse", "--short", "HEAD"]).stdout.strip() or args.rev or "?"
    dirty = sh(["git", "-C", args.src, "status", "--porcelain", "--", "nwhisper"]).stdout.strip()
    peers = sh([args.peer_python, "-c",
                "import importlib.metadata as m\n"
                "print(', '.join(f'{p} {m.version(p)}' for p in ('faster-whisper','ctranslate2','pywhispercpp',"
                "'openai-whisper','transformers','torch')))"]).stdout.strip()
    import numba
    import numpy
    return "\n".join([
        f"nwhisper transcription bench, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"machine: nproc {os.cpu_count()}, {cpu} ({isa}), {mem:.0f} GiB, {platform.platform()}",
        f"nwhisper {('snapshot of ' + args.rev) if args.rev else rev}"
        f"{' (uncommitted changes under nwhisper/)' if dirty and not args.rev else ''}; python "
        f"{platform.python_version()}, numba {numba.__version__}, numpy {numpy.__version__}",
        f"peers: {peers}",
        f"settings: {THREADS} threads each, greedy, temperature 0 (no fallback), timestamps on "
        "(nwhisper: timestamps=True), condition on previous text, no VAD, language en; "
        f"systems: {', '.join(LABEL[s] for s in systems)}",
        f"{args.rounds} round(s) x (1 cold + {args.repeats} warm + 1 instrumented transcription) per "
        "system, one subprocess each, interleaved; medians over rounds; ratio = system / nwhisper (float32)"])


def profile(args, model, clip, files, npys, numba_cache):
    code = r'''
import cProfile, json, pstats, sys, io
import numpy as np
A = json.loads(sys.argv[1]); sys.path.insert(0, A["src"])
import nwhisper
m = nwhisper.load(A["model"], device="cpu")
audio = np.load(A["npy"])
m.transcribe(audio, language="en", timestamps=True)
pr = cProfile.Profile(); pr.enable()
m.transcribe(audio, language="en", timestamps=True)
pr.disable()
s = io.StringIO(); st = pstats.Stats(pr, stream=s); st.sort_stats("tottime").print_stats(12); print(s.getvalue())
want = [("mel.py", "log_mel", "log-mel"), ("model.py", "encode", "encoder (Whisper.encode)"),
        ("decoding.py", "decode", "greedy loop (GreedyDecoder.decode)"),
        ("model.py", "decode", "  decoder forward (Whisper.decode)"),
        ("decoding.py", "apply", "  TimestampRules.apply"), ("decoding.py", "log_softmax", "  log_softmax (host)")]
for suffix, name, label in want:
    for (f, line, fn), (cc, nc, tt, ct, callers) in st.stats.items():
        if fn == name and f.endswith("nwhisper/" + suffix):
            print(f"  cumulative {label:36s} {ct:7.3f} s in {nc} calls")
'''
    a = {"src": args.src, "model": model, "npy": npys[clip]}
    r = sh([sys.executable, "-c", code, json.dumps(a)], env=child_env(numba_cache), cwd=ROOT)
    text = r.stdout if not r.returncode else r.stderr[-2000:]
    keep, on = [], False
    for ln in text.splitlines():
        if "function calls" in ln or ln.strip().startswith("ncalls"):
            on = True
        if on and (ln.strip() or ln.startswith("  cumulative")):
            keep.append(re.sub(r"\S*/(nwhisper/|site-packages/|python3\.\d+/)", r"\1", ln))
    return f"cProfile, one warm nwhisper transcription, {model} {os.path.basename(CLIPS[clip])}, " \
           f"by own time:\n" + "\n".join(keep)


def roofline(args, models, numba_cache):
    """bench/roofline.py's output for these models, run in a child once the machine is quiet."""
    print("roofline", flush=True)
    settle(args)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "roofline.py"), "--models", ",".join(models),
           "--src", args.src] + (["--repeat", "3"] if args.quick else [])
    r = sh(cmd, env=child_env(numba_cache), cwd=ROOT, timeout=args.child_timeout)
    return r.stdout.strip() if not r.returncode else f"roofline failed: {r.stderr.strip()[-500:]}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="11 s clip only, 1 round, 2 warm repeats")
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--clips", default=None, help="11,63 (default; --quick: 11)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    p.add_argument("--repeats", type=int, default=None, help="warm repeats per process, default 3 (--quick: 2)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "nwhisper-bench"),
                   help="converted models, audio .npy and Numba cache are kept here")
    p.add_argument("--rev", default=None, help="bench a `git archive` snapshot of this commit, not the checkout")
    p.add_argument("--src", default=ROOT, help=argparse.SUPPRESS)
    p.add_argument("--peer-python", default=os.path.join(ROOT, ".oracle", "bin", "python"))
    p.add_argument("--quiet-load", type=float, default=0.5, help="wait for a 1-min load average below this")
    p.add_argument("--max-wait", type=float, default=600, help="... but no longer than this many seconds")
    p.add_argument("--max-foreign", type=float, default=0.25,
                   help="rerun a child when other processes took more cores than this during it")
    p.add_argument("--attempts", type=int, default=3, help="... at most this many runs in all")
    p.add_argument("--no-first-cold", action="store_true", help="skip the run with an empty Numba cache")
    p.add_argument("--profile", action="store_true", help="cProfile one warm nwhisper transcription")
    p.add_argument("--no-roofline", action="store_true", help="skip bench/roofline.py's summary")
    p.add_argument("--child-timeout", type=float, default=900)
    p.add_argument("--resume", metavar="RAW.jsonl", help="reuse the runs recorded in this file; run the rest")
    args = p.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.repeats = args.repeats or (2 if args.quick else 3)
    clips = (args.clips or ("11" if args.quick else "11,63")).split(",")
    models = args.models.split(",")
    systems = args.systems.split(",")
    if "nwhisper" not in systems:
        systems.insert(0, "nwhisper")
    os.makedirs(args.work, exist_ok=True)
    done = {}           # (round, model, clip, system) -> result, from --resume
    if args.resume:
        with open(args.resume) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("rev_sha") and not args.rev:
                    args.rev = rec["rev_sha"]      # the same snapshot as the run resumed
                if "system" in rec and "error" not in rec["result"]:
                    done[(rec["round"], rec["model"], rec["clip"], rec["system"])] = rec["result"]
    if args.rev:
        sha = sh(["git", "-C", ROOT, "rev-parse", args.rev], check=True).stdout.strip()
        args.src = os.path.join(args.work, "src-" + sha[:12])
        if not os.path.isdir(args.src):
            os.makedirs(args.src)
            subprocess.run(f"git -C {ROOT} archive {sha} nwhisper | tar -x -C {args.src}", shell=True, check=True)
        args.rev = f"{args.rev} ({sha[:10]})" if not args.rev.startswith(sha) else sha[:10]
    else:
        sha = None
    if not os.path.exists(args.peer_python):
        print(f"no peer interpreter at {args.peer_python}: only nwhisper runs")
        systems = [s for s in systems if s.startswith("nwhisper")]
    numba_cache = os.path.join(args.work, "numba-cache-" + os.path.basename(args.src.rstrip("/")))
    raw_path = args.resume or os.path.join(args.work, f"raw-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    raw = open(raw_path, "a")

    def record(**rec):
        raw.write(json.dumps(rec) + "\n")
        raw.flush()
    print(f"raw results: {raw_path} (continue an interrupted run with --resume {raw_path})", flush=True)

    files, npys = prepare(args, models, clips)
    t_start = time.time()

    print("round 0 (not recorded): page cache and Numba cache", flush=True)
    for model in models:
        for clip in clips:
            for s in systems:
                r = run_child(args, s, model, clip, files, npys, 0, numba_cache, retry=False)
                if "error" in r:
                    print(f"  {s} {model} {clip}: {r['error']}", flush=True)

    la, waited = wait_quiet(args.quiet_load, args.max_wait)
    print(f"load average {la:.2f} after waiting {waited:.0f} s; timing", flush=True)
    record(start=time.time(), load=la, waited=waited, rev_sha=sha)
    first_cold = {}
    if not args.no_first_cold and not args.quick:
        for model in models:              # every kernel compiles: an empty cache per model
            key = ("first", model, clips[0], "nwhisper")
            if key in done:
                r = done[key]
            else:
                with tempfile.TemporaryDirectory(dir=args.work) as empty:
                    r = run_child(args, "nwhisper", model, clips[0], files, npys, 0, empty)
                record(round="first", model=model, clip=clips[0], system="nwhisper", result=r)
            first_cold[model] = r
            print(f"nwhisper first-ever cold, {model}: "
                  f"{r.get('cold', float('nan')):.1f} s {r.get('error', '')}", flush=True)

    runs = {}
    for rnd in range(args.rounds):
        for model in models:
            for clip in clips:
                order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
                for s in order:
                    key = (rnd, model, clip, s)
                    if key in done:
                        r = done[key]
                    else:
                        r = run_child(args, s, model, clip, files, npys, args.repeats, numba_cache)
                        record(round=rnd, model=model, clip=clip, system=s, result=r)
                    runs.setdefault((model, clip, s), []).append(r)
                    msg = r.get("error") or (f"cold {r['cold']:.2f} s, warm {med(r['warm']):.3f} s, "
                                             f"foreign {r['foreign']:.2f} cores, load {r['load']:.2f}")
                    print(f"  round {rnd + 1}/{args.rounds} {model} {clip}s {s}: {msg}"
                          f"{' (resumed)' if key in done else ''}", flush=True)

    roof = None if args.no_roofline else roofline(args, models, numba_cache)
    print()
    print(header(args, systems))
    all_runs = [r for rs in runs.values() for r in rs if "error" not in r]
    if all_runs:
        fo = [r["foreign"] for r in all_runs]
        print(f"load: 1-min average {la:.2f} when timing began (after waiting {waited:.0f} s for < "
              f"{args.quiet_load}); other processes' CPU while children ran: median "
              f"{statistics.median(fo):.2f} cores, max {max(fo):.2f}; steal median "
              f"{statistics.median(r['steal'] for r in all_runs):.2f}; "
              f"{sum(r['attempts'] - 1 for r in all_runs)} rerun(s) for noise; total {time.time() - t_start:.0f} s")
    if roof:
        print()
        print(roof)
    for model in models:
        for clip in clips:
            summ = {s: summarise(runs.get((model, clip, s), []), args.max_foreign) for s in systems}
            dur = os.path.getsize(npys[clip]) / 4 / 16000
            print()
            print(table(f"{model} · {os.path.basename(CLIPS[clip])} ({dur:.1f} s)", summ, systems))
    if first_cold:
        print()
        for model, r in first_cold.items():
            if "error" in r:
                print(f"nwhisper first-ever cold, {model}: {r['error']}")
            else:
                print(f"nwhisper first-ever cold command (empty Numba cache, every kernel compiles), {model}, "
                      f"{os.path.basename(CLIPS[clips[0]])}: {r['cold']:.1f} s (import+load {r['import_load']:.1f} s)")
    if args.profile:
        for model in models:
            print()
            print(profile(args, model, clips[0], files, npys, numba_cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
