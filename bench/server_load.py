"""A bounded load test of `nwhisper serve`: N clients posting one clip for S seconds, on loopback.

    python3 bench/server_load.py [--clients 8] [--seconds 60] [--model tiny.en] [--compute-type float32]
                                 [--clip fixtures/jfk.wav]
    python3 bench/server_load.py --url http://127.0.0.1:6543     (a server you started; loopback only)

Without --url it starts its own server (`python -m nwhisper serve MODEL --addr 127.0.0.1:0`)
and stops it at the end. Each client keeps one keep-alive connection and posts the clip to
/inference back to back until the time is up; a request in flight at the deadline is waited
for, so the test ends by itself within S seconds plus one request's latency per client.

Prints: requests answered, failed (status ≠ 200 or the wrong text), lost (sent, no answer);
latency p50/p90/p99/max (each includes the wait behind the other clients: the server runs one
transcription at a time, so with N clients a request's latency is about N service times);
throughput and audio seconds per wall second; the server's RSS at start, every 10 s and at end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECT = "ask not what your country can do for you"     # in fixtures/jfk.wav's transcript


def start_server(model, *args, log=None):
    """(Popen, url) of `python -m nwhisper serve MODEL --addr 127.0.0.1:0 ARGS` once it serves."""
    log = log or tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False).name
    env = {k: v for k, v in os.environ.items() if k != "NWHISPER_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "nwhisper", "serve", model, "--addr", "127.0.0.1:0", *args],
                            cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300:
        with open(log) as f:
            m = re.search(r"serving on (\S+)", f.read())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            with open(log) as f:
                raise SystemExit(f"server exited:\n{f.read()}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start in 300 s")


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return float("nan")


def form(path):
    b = uuid.uuid4().hex
    with open(path, "rb") as f:
        data = f.read()
    body = (f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{os.path.basename(path)}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{b}--\r\n".encode()
    return body, f"multipart/form-data; boundary={b}"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def client(url, body, ctype, deadline, out):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            conn.request("POST", "/inference", body, {"Content-Type": ctype})
            r = conn.getresponse()
            answer = r.read()
        except (OSError, http.client.HTTPException) as e:
            out.append(("lost", time.monotonic() - t0, repr(e)))
            conn.close()
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
            continue
        dt = time.monotonic() - t0
        ok = r.status == 200 and EXPECT in json.loads(answer).get("text", "")
        out.append(("ok" if ok else "failed", dt, "" if ok else f"{r.status} {answer[:200]!r}"))
    conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--compute-type", default="float32")
    ap.add_argument("--clip", default=os.path.join(ROOT, "fixtures", "jfk.wav"))
    ap.add_argument("--url", help="an already running server on loopback (default: start one)")
    a = ap.parse_args()

    proc = None
    if a.url:
        host = urllib.parse.urlsplit(a.url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("this load test runs against loopback only")
        url, pid = a.url, None
    else:
        proc, url = start_server(a.model, "--compute-type", a.compute_type)
        pid = proc.pid
    body, ctype = form(a.clip)
    import soundfile

    clip_s = soundfile.info(a.clip).duration
    print(f"# {a.clients} clients × {a.seconds:.0f} s against {url} ({a.model} {a.compute_type}, {os.path.basename(a.clip)} "
          f"{clip_s:.1f} s); load average {open('/proc/loadavg').read().split()[0]}")
    rss = [(0.0, rss_mb(pid))] if pid else []
    results, threads = [], []
    t_start = time.monotonic()
    deadline = t_start + a.seconds
    for _ in range(a.clients):
        out = []
        results.append(out)
        threads.append(threading.Thread(target=client, args=(url, body, ctype, deadline, out), daemon=True))
        threads[-1].start()
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if pid and time.monotonic() - t_start >= 10 * len(rss):
            rss.append((time.monotonic() - t_start, rss_mb(pid)))
    wall = time.monotonic() - t_start
    if pid:
        rss.append((wall, rss_mb(pid)))
        stop_server(proc)

    flat = [r for out in results for r in out]
    ok = [dt for kind, dt, _ in flat if kind == "ok"]
    failed = [msg for kind, _, msg in flat if kind == "failed"]
    lost = [msg for kind, _, msg in flat if kind == "lost"]
    print(f"requests  {len(flat)} answered {len(ok) + len(failed)}  ok {len(ok)}  failed {len(failed)}  "
          f"lost {len(lost)}  (per client: {', '.join(str(len(o)) for o in results)})")
    for msg in (failed + lost)[:5]:
        print(f"  e.g. {msg}")
    if ok:
        print(f"latency s p50 {pct(ok, 50):.2f}  p90 {pct(ok, 90):.2f}  p99 {pct(ok, 99):.2f}  "
              f"max {max(ok):.2f}  mean {statistics.mean(ok):.2f}")
        print(f"throughput {len(ok) / wall:.2f} req/s  = {len(ok) * clip_s / wall:.1f} s of audio per s "
              f"(wall {wall:.1f} s, one transcription at a time → service time ≈ {wall / len(ok):.2f} s)")
    if rss:
        print("server RSS MB " + "  ".join(f"{t:.0f}s:{m:.0f}" for t, m in rss) +
              f"  (end − start {rss[-1][1] - rss[0][1]:+.0f} MB)")
    return 0 if ok and not failed and not lost else 1


if __name__ == "__main__":
    sys.exit(main())
