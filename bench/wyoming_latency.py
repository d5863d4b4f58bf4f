"""End of audio → transcript over the Wyoming protocol (Home Assistant's voice path): nwhisper's
Wyoming endpoint against wyoming-faster-whisper, paced like a live microphone.

    python3 bench/wyoming_latency.py [--model base] [--reps 3] [--tail-ms 700] [--max-s 15]
                                     [--only nwhisper|anchor] [--work DIR] [-v]

The two servers, on the same CTranslate2 directory (built once in --work from the installed model
package, bench/transcribe.py's ct2_dir), int8, CPU, 2 threads, language "en":
  nwhisper  python3 -m nwhisper serve CT2 --wyoming tcp://127.0.0.1:PORT --no-http
                --compute-type int8 --device cpu            (NUMBA/OMP/MKL/... threads = 2)
  anchor    .oracle/bin/python -m wyoming_faster_whisper (wyoming-faster-whisper 3.8.1, with
                faster-whisper 1.2.1) --uri tcp://127.0.0.1:PORT --model CT2 --data-dir WORK/fw-data
                --local-files-only --stt-library faster-whisper --device cpu --compute-type int8
                --language en --cpu-threads 2 --beam-size 1            (OMP threads = 2 as well)
--beam-size 1 because nwhisper decodes greedily by default (wyoming-faster-whisper's own default,
0 = auto, is 5 on x86 and 1 on ARM). The rest is each server's own default: wyoming-faster-whisper
calls WhisperModel.transcribe(wav, beam_size=1, language="en", initial_prompt=None,
vad_filter=False), i.e. faster-whisper's temperature fallback and timestamps on, on the whole
utterance once audio-stop arrives (it is a batch server: it advertises no transcript streaming and
requires_external_vad=true). Each server is started, then asked `describe` until it answers
`info` (--start-timeout); both stay up for the whole run.

The clips: every English row of fixtures/index.tsv no longer than --max-s (the default 15 s
keeps the voice-command-sized ones: jfk, the LibriVox lines, cards/*, forever, espeak en-11s, and
drops the 63 s espeak clip), decoded to 16 kHz mono int16. One request = one fresh TCP connection
(as Home Assistant's Wyoming STT opens one per utterance): `transcribe` (language "en"),
`audio-start` (16000 Hz, 2 bytes, 1 channel), then `audio-chunk`s of 1024 samples at real-time
pace (chunk k written at t0 + k·1024/16000), the clip followed by --tail-ms of silence (700 ms:
the silence Home Assistant's own VAD waits for before it ends a command), then `audio-stop` right
after the last chunk. Events from the server are read concurrently: transcript-start,
transcript-chunk and transcript-stop are counted (never required); the request ends at the first
`transcript`.

wait = the first `transcript`'s arrival − the moment audio-stop was written (or was due, if the
server already closed the connection). A server that answers before audio-stop (its own
endpointing) gets a negative wait: it counts in `early` and as 0 in p50/p95/max. Each server gets
one untimed warm-up request (jfk.wav, unpaced) first; then --reps rounds over all clips, the
servers alternating clip by clip (their order swapped every round), so drift in the machine's
speed hits both alike. WER = word edits / reference words over all requests (lower case,
punctuation dropped, bench/transcribe.py's words/word_edits: "Mr." ≠ "mister", "8" ≠ "eight", so
no system reaches 0). ratio = nwhisper p50 / anchor p50 (< 1: nwhisper answers sooner). Every
request (wait, text, events seen) is written to --work/wyoming-latency-*.json, the servers' logs
to --work/*.log.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import ROOT, THREADS  # noqa: E402
from server_load import pct  # noqa: E402
from transcribe import child_env, ct2_dir, word_edits, words  # noqa: E402

sys.path.insert(0, ROOT)

from wyoming.asr import Transcribe, Transcript  # noqa: E402
from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402

SR, WIDTH, CHANNELS, CHUNK = 16000, 2, 1, 1024
SERVERS = ["nwhisper", "anchor"]
FIX = os.path.join(ROOT, "fixtures")


# --- the clips ---------------------------------------------------------------------------------
def clips(max_s):
    """[(name, int16 PCM bytes, reference)] for the English fixture clips of <= max_s seconds."""
    from nwhisper.io.audio import load_audio

    with open(os.path.join(FIX, "index.tsv")) as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t")
                if r["language"] == "en" and float(r["seconds"]) <= max_s]
    out = []
    for r in rows:
        x = load_audio(os.path.join(FIX, r["path"]), sr=SR)
        pcm = (np.clip(x, -1.0, 32767 / 32768) * 32768).astype("<i2").tobytes()
        out.append((r["path"], pcm, r["transcript"]))
    return out


# --- the servers -------------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(side, ct2, port, work, peer_python):
    uri = f"tcp://127.0.0.1:{port}"
    if side == "nwhisper":
        return [sys.executable, "-m", "nwhisper", "serve", ct2, "--wyoming", uri, "--no-http",
                "--compute-type", "int8", "--device", "cpu"]
    return [peer_python, "-m", "wyoming_faster_whisper", "--uri", uri, "--model", ct2,
            "--data-dir", os.path.join(work, "fw-data"), "--local-files-only",
            "--stt-library", "faster-whisper", "--device", "cpu", "--compute-type", "int8",
            "--language", "en", "--cpu-threads", str(THREADS), "--beam-size", "1"]


async def describe(port, timeout):
    """The server's `info`, or None while it does not answer yet."""
    try:
        async with AsyncTcpClient("127.0.0.1", port, connect_timeout=timeout, read_timeout=timeout) as c:
            await c.write_event(Describe().event())
            while True:
                e = await c.read_event()
                if e is None:
                    return None
                if Info.is_type(e.type):
                    return Info.from_event(e)
    except (OSError, asyncio.TimeoutError):
        return None


def log_tail(path, n=25):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def start(side, ct2, work, peer_python, timeout):
    """(Popen, port, Info) once the server answers describe; SystemExit with its log if not."""
    port = free_port()
    cmd = command(side, ct2, port, work, peer_python)
    log = os.path.join(work, f"{side}.log")
    env = child_env(os.path.join(tempfile.gettempdir(), "nwhisper-bench-numba"))
    env.pop("NWHISPER_TOKEN", None)
    os.makedirs(os.path.join(work, "fw-data"), exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            tail = log_tail(log)
            hint = ""
            if side == "nwhisper" and any(s in tail for s in ("--wyoming", "--no-http", "No such option")):
                hint = ("\nThis nwhisper has no Wyoming endpoint yet: `nwhisper serve --wyoming URI "
                        "--no-http` is not implemented in this checkout. Run the anchor alone with "
                        "--only anchor.")
            raise SystemExit(f"{side} exited with code {proc.returncode} before it served.\n"
                             f"command: {' '.join(cmd)}\nlog ({log}), last lines:\n{tail}{hint}")
        info = asyncio.run(describe(port, 5))
        if info is not None:
            if not info.asr:
                stop(proc)
                raise SystemExit(f"{side} answered describe with no ASR program: {info.event().data}")
            return proc, port, info
        time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"{side} did not answer describe on port {port} within {timeout:.0f} s.\n"
                     f"command: {' '.join(cmd)}\nlog ({log}), last lines:\n{log_tail(log)}")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- one request -------------------------------------------------------------------------------
async def request(port, pcm, tail_ms, paced=True, read_timeout=300.0):
    """Send one utterance as Home Assistant does; the wait and what came back."""
    audio = pcm + b"\0" * (int(SR * tail_ms / 1000) * WIDTH)
    step = CHUNK * WIDTH * CHANNELS
    chunks = [audio[i:i + step] for i in range(0, len(audio), step)]
    seen = {"transcript-start": 0, "transcript-chunk": 0, "transcript-stop": 0, "other": []}
    got = {}

    async with AsyncTcpClient("127.0.0.1", port, connect_timeout=30) as c:
        async def reader():
            while True:
                e = await c.read_event()
                if e is None:
                    got.setdefault("closed", time.perf_counter())
                    return
                if Transcript.is_type(e.type):
                    got["at"], got["text"] = time.perf_counter(), Transcript.from_event(e).text
                    return
                if e.type in seen:
                    seen[e.type] += 1
                else:
                    seen["other"].append(e.type)

        task = asyncio.create_task(reader())
        await c.write_event(Transcribe(language="en").event())
        await c.write_event(AudioStart(rate=SR, width=WIDTH, channels=CHANNELS).event())
        t0 = time.perf_counter()
        stop_at = None
        try:
            for k, chunk in enumerate(chunks):
                if paced:
                    await asyncio.sleep(max(0.0, t0 + k * CHUNK / SR - time.perf_counter()))
                await c.write_event(AudioChunk(rate=SR, width=WIDTH, channels=CHANNELS, audio=chunk).event())
            await c.write_event(AudioStop().event())
            stop_at = time.perf_counter()
        except (ConnectionError, OSError):       # the server answered and closed: when stop was due
            stop_at = t0 + (len(chunks) - 1) * CHUNK / SR if paced else time.perf_counter()
        try:
            await asyncio.wait_for(task, read_timeout)
        except asyncio.TimeoutError:
            task.cancel()
            got.setdefault("error", f"no transcript within {read_timeout:.0f} s of audio-stop")
    if "at" not in got:
        got.setdefault("error", "connection closed without a transcript")
        return {"error": got["error"], "events": seen}
    return {"wait": got["at"] - stop_at, "text": got["text"], "events": seen}


# --- the run -----------------------------------------------------------------------------------
def build_ct2(model, work):
    path = os.path.join(work, f"ct2-{model}")
    if not os.path.isdir(path):
        part = path + ".part"
        shutil.rmtree(part, ignore_errors=True)
        ct2_dir(model, part)
        os.rename(part, path)
    return path


def summary(rows):
    ok = [r for r in rows if "wait" in r]
    waits = [max(0.0, r["wait"]) * 1000 for r in ok]
    edits = sum(word_edits(r["text"], r["ref"]) for r in ok)
    n_ref = sum(len(words(r["ref"])) for r in ok)
    return {"n": len(rows), "ok": len(ok), "failed": len(rows) - len(ok),
            "p50": pct(waits, 50) if waits else None, "p95": pct(waits, 95) if waits else None,
            "max": max(waits) if waits else None, "early": sum(r["wait"] < 0 for r in ok),
            "wer": edits / n_ref if n_ref else None,
            "events": {k: sum(r["events"][k] for r in rows)
                       for k in ("transcript-start", "transcript-chunk", "transcript-stop")}}


def info_line(info):
    p = info.asr[0]
    return (f"program {p.name!r} {p.version or ''}, models {[m.name for m in p.models]}, "
            f"supports_transcript_streaming={p.supports_transcript_streaming}, "
            f"requires_external_vad={p.requires_external_vad}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="base", help="model package name for ct2_dir (default base)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tail-ms", type=int, default=700, help="silence after each clip, before audio-stop")
    ap.add_argument("--max-s", type=float, default=15.0, help="longest fixture clip used (seconds)")
    ap.add_argument("--only", choices=SERVERS, help="run one server only")
    ap.add_argument("--peer-python", default=os.path.join(ROOT, ".oracle", "bin", "python"))
    ap.add_argument("--start-timeout", type=float, default=600.0,
                    help="seconds a server may take to answer describe (Numba's first compile)")
    ap.add_argument("--work", default="/tmp/nwhisper-wyoming-bench")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every request")
    a = ap.parse_args()
    sides = [a.only] if a.only else SERVERS
    os.makedirs(a.work, exist_ok=True)
    ct2 = build_ct2(a.model, a.work)
    items = clips(a.max_s)
    audio_s = sum(len(p) for _, p, _ in items) / (SR * WIDTH)

    procs, ports, infos = {}, {}, {}
    try:
        for side in sides:
            procs[side], ports[side], infos[side] = start(side, ct2, a.work, a.peer_python, a.start_timeout)
        for side in sides:       # warm-up, untimed
            asyncio.run(request(ports[side], next(p for n, p, _ in items if n == "jfk.wav"), a.tail_ms, paced=False))
        rows = {s: [] for s in sides}
        for rep in range(a.reps):
            order = sides if rep % 2 == 0 else sides[::-1]
            for name, pcm, ref in items:
                for side in order:
                    r = asyncio.run(request(ports[side], pcm, a.tail_ms))
                    r.update(server=side, clip=name, rep=rep, ref=ref)
                    rows[side].append(r)
                    if a.verbose:
                        print(f"  {side:8} r{rep} {name:60} "
                              + (f"wait {1000 * r['wait']:6.0f} ms  {r['text'].strip()!r}" if "wait" in r
                                 else f"FAILED: {r['error']}"), flush=True)
    finally:
        for p in procs.values():
            stop(p)

    summ = {s: summary(rows[s]) for s in sides}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(a.work, f"wyoming-latency-{stamp}.json"), "w") as f:
        json.dump({"args": vars(a), "summary": summ, "rows": rows}, f, indent=1)

    print(f"# Wyoming end of audio -> transcript, {a.model} int8 CPU, {THREADS} threads, "
          f"{len(items)} clips ({audio_s:.1f} s) x {a.reps} reps at real-time pace + {a.tail_ms} ms "
          f"silence; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{open('/proc/loadavg').read().split()[0]}; {os.cpu_count()} cores")
    for s in sides:
        print(f"# {s}: {info_line(infos[s])}")
    print()
    print("| server | clips×reps | wait p50 ms | p95 ms | max ms | early | failed | WER |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    f0 = lambda v: "-" if v is None else f"{v:.0f}"   # noqa: E731
    for s in sides:
        r = summ[s]
        wer = "-" if r["wer"] is None else f"{r['wer']:.3f}"
        print(f"| {s} | {len(items)}×{a.reps} | {f0(r['p50'])} | {f0(r['p95'])} | {f0(r['max'])} "
              f"| {r['early']} | {r['failed']} | {wer} |")
    print()
    for s in sides:
        e = summ[s]["events"]
        print(f"{s}: transcript-start {e['transcript-start']}, transcript-chunk {e['transcript-chunk']}, "
              f"transcript-stop {e['transcript-stop']} (before the transcript, over all requests)")
    if len(sides) == 2 and summ["anchor"]["p50"] and summ["nwhisper"]["p50"] is not None:
        print(f"ratio nwhisper p50 / anchor p50 = {summ['nwhisper']['p50'] / summ['anchor']['p50']:.2f}")


if __name__ == "__main__":
    main()
