"""End of speech → final, over the live WebSocket, in four rooms; then eight streams at once.

    python3 bench/stream_latency.py [--models tiny.en,base] [--computes float32,int8]
                                    [--rooms quiet,tv,music,music5] [--realtime-rooms quiet]
                                    [--pause 300] [--load-s 60]
                                    [--load-model base] [--load-compute int8] [--work DIR]

The rooms (tests/helpers/rooms.py: quiet, tv, music, music5) are built in --work (default
/tmp/nwhisper-stream-bench) from fixture speech: eight answers of one speaker, in a quiet room,
under a television voice 12 dB below, under plucked-chord music 10 and 5 dB below. Each room is
streamed at real-time pace (nwhisper.server.client, 40 ms pcm16 frames, pause_ms --pause) to
`nwhisper serve MODEL --compute-type C`.

Per room: latency = the final's arrival − the moment the answer's last voiced sample was sent
(p50 / p95 / max over the answers); `right` = answers with exactly one final, on that answer
alone, starting no more than 0.3 s before its voice; `stray` = finals on no answer (the other
voice alone); `merged` = finals over two answers; `early` = finals that start > 0.3 s before
their answer's voice (the other voice at its start); `missed` = answers with no final.

The `rt-` rows stream a room to OpenAI's Realtime route instead (/v1/realtime, OpenAI's own
client, PCM16 at 24 kHz, server_vad with silence_duration_ms --pause): latency = the completed
transcript's arrival − the end of the answer's voice. Realtime events carry the utterance's span
(audio_start_ms includes prefix_padding_ms, 300 ms; audio_end_ms the tail), so its voice is taken
as that span less the padding at the start.

The load run (its own server, --connections 9): eight streams of the quiet room looped to
--load-s seconds, partials on, all at once, plus one HTTP client posting jfk.wav to /inference
back to back, for --load-s seconds
(loopback; it stops by itself). It prints finals received against answers sent, latency
percentiles across all streams, the server's queue waits by priority (/health queue_wait_ms:
a final never waits behind a draft that came after it), and the server's RSS before, every 10 s
and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import urllib.request

import numpy as np
import soundfile as sf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_load import EXPECT, ROOT, form, pct, rss_mb, start_server, stop_server  # noqa: E402

sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))
from rooms import ROOMS, build  # noqa: E402
from nwhisper.io.audio import resample  # noqa: E402
from nwhisper.server.client import encode, realtime, stream  # noqa: E402

SR = 16000
FIX = os.path.join(ROOT, "fixtures")
EARLY_S = 0.3
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def judge(finals, truth, sent_at):
    """Per answer its latency, and the counts (module docstring) for one streamed room."""
    lat, counts = [], {"right": 0, "stray": 0, "merged": 0, "early": 0, "missed": 0}
    on = {i: [] for i in range(len(truth))}
    for at, f in finals:
        hit = [i for i, (a, b) in enumerate(truth) if f["speech_t0"] < b + 0.1 and f["speech_t1"] > a - 0.1]
        if not hit:
            counts["stray"] += 1
        elif len(hit) > 1:
            counts["merged"] += 1
        else:
            on[hit[0]].append((at, f))
            if f["speech_t0"] < truth[hit[0]][0] - EARLY_S:
                counts["early"] += 1
    for i, got in on.items():
        if not got:
            counts["missed"] += 1
            continue
        if len(got) == 1 and got[0][1]["speech_t0"] >= truth[i][0] - EARLY_S:
            counts["right"] += 1
        lat.append(max(at for at, _ in got) - sent_at(truth[i][1]))
    return lat, counts


def stream_room(url, path, pause, pace=1.0, partials=False):
    x = sf.read(path, dtype="float32")[0]
    r = asyncio.run(stream(url, x, config={"pause_ms": pause, "partials": partials}, pace=pace, linger=6))
    return [(m.at, m.msg) for m in r.messages if m.msg.get("type") == "final"], r.errors


PADDING_MS = 300


def realtime_room(url, path, pause):
    """The room through /v1/realtime at 24 kHz: [(arrival, final-like dict)], errors."""
    x = resample(sf.read(path, dtype="float32")[0], SR, 24000)
    pcm = encode(x, "pcm16")[0]
    frames = [pcm[i:i + 1920] for i in range(0, len(pcm), 1920)]          # 40 ms
    session = {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 24000},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": pause,
                           "prefix_padding_ms": PADDING_MS}}}}
    events = asyncio.run(realtime(url, frames, 0.04, session, linger=6))
    span, finals = {}, []
    for at, e in events:
        if e["type"] == "input_audio_buffer.speech_started":
            span[e["item_id"]] = [e["audio_start_ms"] / 1000 + PADDING_MS / 1000, None]
        elif e["type"] == "input_audio_buffer.speech_stopped":
            span[e["item_id"]][1] = e["audio_end_ms"] / 1000
        elif e["type"].endswith("transcription.completed") and e["transcript"]:
            a, b = span[e["item_id"]]
            finals.append((at, {"speech_t0": a, "speech_t1": b, "text": e["transcript"]}))
    return finals, [e["error"]["message"] for _, e in events if e["type"] == "error"]


def fmt_ms(xs):
    if not xs:
        return "-"
    ms = [1000 * v for v in xs]
    return f"{pct(ms, 50):5.0f} {pct(ms, 95):5.0f} {max(ms):5.0f}"


def health(url):
    with _opener.open(url + "/health", timeout=30) as r:
        return json.loads(r.read())


def load_run(url, pid, path, truth, seconds, pause, load_s):
    """Eight streams and an HTTP client for load_s seconds; what came back."""
    x = sf.read(path, dtype="float32")[0]
    loops = max(1, int(np.ceil(load_s / seconds)))
    x = np.tile(x, loops)[:int(load_s * SR)]
    spans = [(a + k * seconds, b + k * seconds) for k in range(loops) for a, b in truth
             if b + k * seconds < load_s - 1]
    body, ctype = form(os.path.join(FIX, "jfk.wav"))
    stop, http = threading.Event(), []

    def poster():
        while not stop.is_set():
            t0 = time.perf_counter()
            req = urllib.request.Request(url + "/inference", data=body, headers={"Content-Type": ctype})
            with _opener.open(req, timeout=600) as r:
                ok = EXPECT in json.loads(r.read())["text"]
            http.append((time.perf_counter() - t0, ok))

    rss = [rss_mb(pid)]

    def sampler():            # the server's RSS every 10 s: does it level off?
        while not stop.wait(10):
            rss.append(rss_mb(pid))

    th = threading.Thread(target=poster, daemon=True)
    th.start()
    threading.Thread(target=sampler, daemon=True).start()

    async def all_streams():
        ws = url.replace("http", "ws", 1) + "/stream"
        # events on: the client then knows of every utterance that opened (drafts may all be
        # dropped under this load) and waits for each one's final before it leaves
        config = {"pause_ms": pause, "partials": True, "events": True}
        return await asyncio.gather(*[stream(ws, x, config=config, pace=1.0, linger=10) for _ in range(8)])

    results = asyncio.run(all_streams())
    stop.set()
    th.join(600)
    rss.append(rss_mb(pid))
    lat, got, counts = [], 0, {}
    for r in results:
        finals = [(m.at, m.msg) for m in r.messages if m.msg.get("type") == "final"]
        l, c = judge(finals, spans, lambda t: t)
        lat += l
        got += len(finals)
        counts = {k: counts.get(k, 0) + v for k, v in c.items()}
    return {"answers": 8 * len(spans), "counts": counts, "finals": got, "lat": lat, "http": http,
            "rss": rss, "waits": health(url)["queue_wait_ms"],
            "errors": sum(len(r.errors) for r in results)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny.en,base")
    ap.add_argument("--computes", default="float32,int8")
    ap.add_argument("--rooms", default=",".join(ROOMS))
    ap.add_argument("--realtime-rooms", default="quiet", help="rooms also sent to /v1/realtime")
    ap.add_argument("--pause", type=int, default=300)
    ap.add_argument("--load-s", type=float, default=60.0, help="0: no load run")
    ap.add_argument("--load-model", default="base")
    ap.add_argument("--load-compute", default="int8")
    ap.add_argument("--work", default="/tmp/nwhisper-stream-bench")
    a = ap.parse_args()
    rooms, truth, seconds = build(a.work)
    print(f"# stream latency, pause_ms {a.pause}, real-time pace, {len(truth)} answers in {seconds:.1f} s "
          f"per room; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{open('/proc/loadavg').read().split()[0]}; {os.cpu_count()} cores")
    print(f"{'model':8} {'compute':8} {'room':8} {'p50':>5} {'p95':>5} {'max':>5}  right stray merged early missed")
    load_done = False
    for model in [m for m in a.models.split(",") if m]:          # --models "": the load run only
        for compute in a.computes.split(","):
            proc, url = start_server(model, "--compute-type", compute)
            try:
                ws = url.replace("http", "ws", 1) + "/stream"
                runs = [(room, lambda r: stream_room(ws, rooms[r], a.pause)) for room in a.rooms.split(",")]
                runs += [(f"rt-{room}", lambda r: realtime_room(url, rooms[r[3:]], a.pause))
                         for room in a.realtime_rooms.split(",") if room]
                for room, go in runs:
                    finals, errors = go(room)
                    lat, c = judge(finals, truth, lambda t: t)
                    print(f"{model:8} {compute:8} {room:8} {fmt_ms(lat)}  {c['right']:3}/{len(truth)} "
                          f"{c['stray']:5} {c['merged']:6} {c['early']:5} {c['missed']:6}"
                          + (f"  errors: {errors}" if errors else ""), flush=True)
            finally:
                stop_server(proc)
    if a.load_s > 0:       # eight stream slots and one for the HTTP client
        proc, url = start_server(a.load_model, "--compute-type", a.load_compute, "--connections", "9")
        try:
            load_done = load_run(url, proc.pid, rooms["quiet"], truth, seconds, a.pause, a.load_s)
        finally:
            stop_server(proc)
    if load_done:
        r = load_done
        w = r["waits"]
        ht = [t for t, _ in r["http"]]
        print(f"\n# load: 8 streams of the quiet room + HTTP, {a.load_s:g} s, {a.load_model} {a.load_compute}")
        c = r["counts"]
        print(f"finals {r['finals']} for {r['answers']} answers: right {c['right']}, stray {c['stray']}, "
              f"merged {c['merged']}, early {c['early']}, missed {c['missed']}; stream errors {r['errors']}")
        print(f"end of speech -> final ms at 8 streams: p50 {pct([1000 * v for v in r['lat']], 50):.0f}, "
              f"p95 {pct([1000 * v for v in r['lat']], 95):.0f}, max {1000 * max(r['lat']):.0f}")
        print(f"queue wait ms: final {w['final']}, draft {w['draft']}, finals overtaken by drafts "
              f"{w['finals_overtaken_by_drafts']}")
        if ht:
            print(f"HTTP /inference during it: {len(ht)} requests, all right: {all(ok for _, ok in r['http'])}, "
                  f"p50 {pct(ht, 50):.2f} s, max {max(ht):.2f} s")
        print(f"server RSS MB, before, every 10 s and after: {' '.join(f'{v:.0f}' for v in r['rss'])}")


if __name__ == "__main__":
    main()
