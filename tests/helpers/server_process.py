"""`nwhisper serve` as a process on loopback, for the end-to-end tests: started on a port it
picks itself (`--addr 127.0.0.1:0`, its URL read from its first line), stopped by SIGTERM."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

from paths import ROOT

JFK = os.path.join(ROOT, "fixtures", "jfk.wav")
JFK_WORDS = "ask not what your country can do for you"
START_TIMEOUT = 180


class Server:
    """`python -m nwhisper serve ARGS --addr 127.0.0.1:0` with its output in a log file."""

    def __init__(self, log_dir, name, *args, env=None, cwd=ROOT, preexec_fn=None):
        self.name = name
        self.log = os.path.join(log_dir, f"{name}.log")
        e = {k: v for k, v in os.environ.items() if k != "NWHISPER_TOKEN"}
        e.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nwhisper", "serve", *args, "--addr", "127.0.0.1:0"],
            cwd=cwd, env=e, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        self.url = None

    def wait(self, timeout=START_TIMEOUT):
        self.url = self._line(r"serving on (\S+)", timeout)
        return self

    def wyoming(self, timeout=START_TIMEOUT):
        """The address of its Wyoming service, as it printed it (tcp://HOST:PORT, unix://PATH)."""
        return self._line(r"Wyoming speech-to-text on (\S+)", timeout)

    def _line(self, pattern, timeout):
        """The first group of `pattern` once the server's output has it."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            m = re.search(pattern, self.output())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited:\n{self.output()}")
            time.sleep(0.1)
        raise RuntimeError(f"server {self.name} did not start in {timeout} s:\n{self.output()}")

    def output(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_servers(log_dir, specs):
    """Start every server at once, then wait for each: {name: Server}."""
    servers = {name: Server(log_dir, name, *args, **kw) for name, (args, kw) in specs.items()}
    try:
        for s in servers.values():
            s.wait()
    except Exception:
        for s in servers.values():
            s.stop()
        raise
    return servers


# -- an HTTP client from the standard library --------------------------------------------------

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(url, body=None, headers=None, method=None, context=None, timeout=120):
    """(status, headers, body bytes) — 4xx/5xx are answers, not exceptions."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    opener = _opener if context is None else urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def multipart(fields=(), files=()):
    """(body, content type) of a multipart/form-data form: fields [(name, value)],
    files [(name, filename, bytes)]."""
    b = uuid.uuid4().hex
    out = []
    for name, value in fields:
        out.append(f'--{b}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, filename, data in files:
        out.append(f'--{b}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                   f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    out.append(f"--{b}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={b}"


def wav():
    with open(JFK, "rb") as f:
        return f.read()


def inference(url, fields=(), data=None, headers=None, path="/inference", **kw):
    body, ctype = multipart(fields, [("file", "jfk.wav", wav() if data is None else data)])
    return http(url + path, body, {"Content-Type": ctype, **(headers or {})}, **kw)
