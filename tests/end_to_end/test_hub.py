"""Models fetched from the Hugging Face Hub by name (io/hub.py), with huggingface_hub's own client
against a Hub of our own on loopback (fake_hub.py, HF_ENDPOINT).

Truth: the repos hold the installed tiny.en's CTranslate2 files under other models' names, so
what a pull leaves must be byte for byte those files, and a transcript from it must be word for
word tiny.en's; the cache layout is huggingface_hub's own (test_model_caches.py shows that
faster-whisper's and transformers' layouts are read). Every failure is one `nwhisper:` line, and
nothing a failed pull leaves is taken for a model.
"""

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
from fake_hub import FakeHub
from paths import FIXTURES, ROOT

from nwhisper.io.registry import resolve

TINY = resolve("tiny.en").path
JFK = os.path.join(FIXTURES, "jfk.wav")


def tiny_files(*leave_out):
    return {f: os.path.join(TINY, f) for f in os.listdir(TINY) if f not in leave_out}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    h = FakeHub({"Systran/faster-whisper-small": tiny_files(),
                 "Systran/faster-whisper-medium.en": tiny_files(),
                 "someone/weights-only": tiny_files("tokenizer.json", "vocabulary.txt"),
                 "someone/readme-only": {"config.json": os.path.join(TINY, "config.json")}})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for v in ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(v, raising=False)
    yield h
    h.stop()


def nwhisper(*args, env=None, wait=True):
    cmd = [sys.executable, "-m", "nwhisper", *args]
    e = {**os.environ, **(env or {})}
    if not wait:
        return subprocess.Popen(cmd, env=e, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=e, cwd=ROOT, capture_output=True, text=True, timeout=300)


def fetched(hub):
    return [(m, p.rsplit("/", 1)[1], r) for m, p, r in hub.requests if m == "GET" and "/resolve/" in p]


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def failed(run):
    """The one line a failure ends with."""
    assert run.returncode == 2 and "Traceback" not in run.stderr, (run.stdout, run.stderr)
    return run.stderr.strip().splitlines()[-1]


def test_first_use_downloads_and_says_so_then_never_again(hub):
    first = nwhisper("transcribe", "medium.en", JFK)
    assert first.returncode == 0, first.stderr
    assert "medium.en: downloading Systran/faster-whisper-medium.en from " + hub.url in first.stderr
    assert "model.bin:" in first.stderr and "B/s" in first.stderr    # a progress bar per file
    tiny = nwhisper("transcribe", "tiny.en", JFK)
    assert first.stdout == tiny.stdout and "ask not what your country" in first.stdout
    src = resolve("medium.en")
    assert src.container == "ct2" and "models--Systran--faster-whisper-medium.en" in src.path
    assert {f: sha(os.path.join(src.path, f)) for f in os.listdir(src.path)} == \
        {f: sha(os.path.join(TINY, f)) for f in os.listdir(TINY)}
    n = len(hub.requests)
    again = nwhisper("models", "pull", "medium.en")
    assert again.returncode == 0 and again.stdout.split()[:2] == ["medium.en", "ct2"], again.stderr
    assert "downloading" not in again.stderr and len(hub.requests) == n          # nothing asked
    listed = nwhisper("models").stdout
    assert any(ln.startswith("medium.en") and src.path in ln for ln in listed.splitlines()), listed
    # huggingface_hub itself takes what we left as whole, offline (faster-whisper's own call)
    import huggingface_hub
    assert huggingface_hub.snapshot_download(
        "Systran/faster-whisper-medium.en", local_files_only=True, cache_dir=os.environ["HF_HUB_CACHE"],
        allow_patterns=["config.json", "preprocessor_config.json", "model.bin", "tokenizer.json",
                        "vocabulary.*"]) == src.path


def test_what_huggingface_hub_downloaded_is_used_without_asking(hub):
    import huggingface_hub

    snap = huggingface_hub.snapshot_download("Systran/faster-whisper-small", endpoint=hub.url,
                                             cache_dir=os.environ["HF_HUB_CACHE"])
    n = len(hub.requests)
    assert resolve("small").path == snap
    run = nwhisper("transcribe", "small", JFK, "--offline")
    assert run.returncode == 0 and "ask not what your country" in run.stdout, run.stderr
    assert len(hub.requests) == n


def test_serve_and_batch_fetch_on_first_use(hub, tmp_path):
    from server_process import Server, inference

    srv = Server(str(tmp_path), "hub", "medium.en", env={"HF_ENDPOINT": hub.url}).wait()
    try:
        status, _, body = inference(srv.url)
        assert status == 200 and b"ask not what your country" in body
        assert "medium.en: downloading Systran/faster-whisper-medium.en" in srv.output()
    finally:
        srv.stop()
    run = nwhisper("batch", JFK, "-o", str(tmp_path / "out"), "-m", "small", "-f", "txt", "--no-progress")
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("small: downloading Systran/faster-whisper-small") == 1
    assert "ask not what your country" in (tmp_path / "out" / "jfk.txt").read_text()
    assert "offline" in failed(nwhisper("serve", "large-v3", "--offline"))


def test_an_interrupted_pull_resumes_where_it_stopped(hub, tmp_path):
    hub.throttle["model.bin"] = 8e6                  # ~9 s for tiny.en's 75 MB
    p = nwhisper("models", "pull", "small", wait=False)
    blobs = tmp_path / "hub" / "models--Systran--faster-whisper-small" / "blobs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        partial = [f for f in blobs.glob("*.incomplete") if f.stat().st_size > 8 << 20] if blobs.is_dir() else []
        if partial:
            break
        time.sleep(0.1)
    assert partial, p.communicate()
    p.send_signal(signal.SIGKILL)                    # a power cut, not a polite stop
    p.wait()
    with pytest.raises(Exception, match="not found here"):
        resolve("small")                             # the half-written file is no model
    del hub.throttle["model.bin"]
    resumed = nwhisper("models", "pull", "small")
    assert resumed.returncode == 0, resumed.stderr
    ranges = [r for _, f, r in fetched(hub) if f == "model.bin"]
    assert ranges[0] is None and ranges[-1].startswith("bytes=") and int(ranges[-1][6:].split("-")[0]) >= 8 << 20
    assert sha(os.path.join(resolve("small").path, "model.bin")) == sha(os.path.join(TINY, "model.bin"))


def test_offline_never_asks_and_names_what_is_missing(hub):
    for how in ({"HF_HUB_OFFLINE": "1"}, {}):
        args = ("transcribe", "small", JFK) + (() if how else ("--offline",))
        line = failed(nwhisper(*args, env=how))
        assert "small" in line and "offline" in line and "Systran/faster-whisper-small" in line, line
    assert hub.requests == []
    assert nwhisper("models", "pull", "small").returncode == 0
    n = len(hub.requests)
    ok = nwhisper("transcribe", "small", JFK, env={"HF_HUB_OFFLINE": "1"})
    assert ok.returncode == 0 and "ask not what your country" in ok.stdout, ok.stderr
    assert len(hub.requests) == n


def test_broken_repos_and_servers_are_one_clear_line(hub, tmp_path):
    assert "no repository someone/nothing on " + hub.url in failed(nwhisper("models", "pull", "someone/nothing"))
    assert "holds no whole Whisper model" in failed(nwhisper("models", "pull", "someone/readme-only"))
    assert "lacks a tokenizer.json or vocabulary" in failed(nwhisper("models", "pull", "someone/weights-only"))
    hub.gone.add("model.bin")                        # listed, then 404 when fetched
    line = failed(nwhisper("models", "pull", "small"))
    assert "downloading Systran/faster-whisper-small" in line and "model.bin: HTTP 404" in line, line
    hub.gone.clear()
    hub.stall["model.bin"] = 4 << 20                 # the server stops sending, keeps the socket
    t = time.monotonic()
    line = failed(nwhisper("models", "pull", "small", env={"HF_HUB_DOWNLOAD_TIMEOUT": "2"}))
    assert "run it again to resume" in line and time.monotonic() - t < 120, line
    with pytest.raises(Exception, match="not found here"):
        resolve("small")
    assert not list((tmp_path / "hub").glob("models--*/snapshots/*/model.bin"))
