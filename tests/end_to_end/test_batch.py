"""`nwhisper batch` as a user runs it: a folder with a corrupt file among good ones, a manifest,
a run killed midway and restarted, and the same job on a real Ray cluster started here.

Truth: each good recording's outputs are what `nwhisper transcribe -f …` writes for it (the
transcribe path is checked against HF transformers in test_transcribe.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from paths import FIXTURES as FIX, ROOT
GOOD = {"a/one.wav": "cards/001.wav", "a/deep/two.wav": "cards/003.wav",
        "b/one.flac": "cards/002.wav", "three.wav": "cards/004.wav"}


def nwhisper(*args, env=None, **kw):
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "nwhisper", *args], cwd=ROOT, env=e,
                          capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """A folder of recordings (one FLAC, one corrupt, one not audio at all) and the outputs
    `nwhisper transcribe` writes for the good ones."""
    import soundfile as sf
    d = tmp_path_factory.mktemp("archive")
    src = d / "in"
    for rel, clip in GOOD.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        x, sr = sf.read(os.path.join(FIX, clip), dtype="float32")
        sf.write(src / rel, x, sr)
    (src / "a" / "broken.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + os.urandom(40))
    (src / "notes.txt").write_text("not audio: the folder search skips it")
    want = d / "want"
    for rel in GOOD:
        out = want / os.path.dirname(rel)
        r = nwhisper("transcribe", "tiny.en", str(src / rel), "-f", "all", "-o", str(out))
        assert r.returncode == 0, r.stderr
    return src, want


def outputs(folder):
    return sorted(os.path.relpath(os.path.join(dp, f), folder)
                  for dp, _, fs in os.walk(folder) for f in fs if f != "failures.jsonl")


def check_outputs(out, want, fmts=("txt", "srt", "json")):
    expected = sorted(os.path.splitext(rel)[0] + "." + f for rel in GOOD for f in fmts)
    assert outputs(out) == expected
    for rel in expected:
        got, exp = (open(os.path.join(folder, rel), encoding="utf-8").read() for folder in (out, want))
        if rel.endswith(".json"):
            got, exp = json.loads(got), json.loads(exp)
        assert got == exp, rel


def test_folder_with_a_corrupt_file_then_a_rerun(archive, tmp_path):
    src, want = archive
    out = tmp_path / "out"
    r = nwhisper("batch", str(src), "-o", str(out), "-f", "txt,srt,json", "-m", "tiny.en")
    assert r.returncode == 1, r.stderr
    assert "4 transcribed, 0 already done, 1 failed" in r.stderr
    check_outputs(out, want)
    failures = [json.loads(line) for line in open(out / "failures.jsonl")]
    assert [f["path"] for f in failures] == [str(src / "a" / "broken.wav")]
    assert "broken.wav" in failures[0]["error"] and "\n" not in failures[0]["error"]
    before = {p: os.stat(os.path.join(out, p)).st_mtime_ns for p in outputs(out)}
    again = nwhisper("batch", str(src), "-o", str(out), "-f", "txt,srt,json", "-m", "tiny.en")
    assert "0 transcribed, 4 already done, 1 failed" in again.stderr, again.stderr
    assert {p: os.stat(os.path.join(out, p)).st_mtime_ns for p in outputs(out)} == before


def test_manifest_with_languages_and_a_missing_file(archive, tmp_path):
    src, want = archive
    manifest = tmp_path / "list.jsonl"
    rows = [{"path": str(src / "three.wav"), "language": "en"}, {"path": "nowhere.wav"}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    r = nwhisper("batch", str(manifest), "-o", str(out), "-f", "txt", "--no-progress")
    assert r.returncode == 1
    alone = nwhisper("transcribe", "tiny.en", str(src / "three.wav"), "--lang", "en", "-f", "txt",
                     "-o", str(tmp_path / "alone"))
    assert alone.returncode == 0, alone.stderr
    assert open(out / "three.txt").read() == open(tmp_path / "alone" / "three.txt").read()
    failures = [json.loads(line) for line in open(out / "failures.jsonl")]
    assert failures[0]["path"].endswith("nowhere.wav") and "no such file" in failures[0]["error"]


def test_batch_size_runs_transcribes_batched_mode(tmp_path):
    """--batch-size 2 on a recording that Silero's chunks cut in three: the json `nwhisper
    transcribe --batch-size 2` writes for it. An option batched decoding cannot take (--beam 3)
    is refused before any model loads, and nothing is written."""
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(os.path.join(FIX, "espeak", "en-63s.flac"), src / "long.flac")
    want = tmp_path / "want"
    r = nwhisper("transcribe", "tiny.en", str(src / "long.flac"), "--batch-size", "2", "-f", "json", "-o", str(want))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    r = nwhisper("batch", str(src), "-o", str(out), "-f", "json", "-m", "tiny.en", "--batch-size", "2")
    assert r.returncode == 0, r.stderr
    got, exp = (json.load(open(d / "long.json", encoding="utf-8")) for d in (out, want))
    assert got == exp
    assert len(got["speech_regions"]) == 3 and got["text"].strip()
    refused = nwhisper("batch", str(src), "-o", str(tmp_path / "no"), "--batch-size", "2", "--beam", "3")
    assert refused.returncode == 2 and "greedily" in refused.stderr, refused.stderr
    assert not os.path.exists(tmp_path / "no")


def test_killed_midway_and_restarted(archive, tmp_path):
    """SIGKILL after the first recording's outputs appear; the rerun finishes the rest with no
    duplicates and no half-written file left."""
    src, want = archive
    good = tmp_path / "in"
    shutil.copytree(src, good, ignore=shutil.ignore_patterns("broken.wav"))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "nwhisper", "batch", str(good), "-o", str(out), "-f", "txt,srt,json",
            "-m", "tiny.en", "--no-progress"]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        if out.exists() and any(f.endswith(".json") for f in outputs(out)):
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    first = outputs(out)
    assert 0 < len([f for f in first if f.endswith(".json")]) < len(GOOD), first
    r = nwhisper("batch", str(good), "-o", str(out), "-f", "txt,srt,json", "-m", "tiny.en")
    assert r.returncode == 0, r.stderr
    check_outputs(out, want)          # every output whole, no .part file, nothing twice


def test_two_workers_and_a_ray_cluster(archive, tmp_path):
    """Two local worker processes, then a Ray cluster started here (2 CPUs) joined by its address
    (--ray ADDRESS): the same outputs."""
    src, want = archive
    good = tmp_path / "in"
    shutil.copytree(src, good, ignore=shutil.ignore_patterns("broken.wav"))
    r = nwhisper("batch", str(good), "-o", str(tmp_path / "local"), "-f", "txt,srt,json",
                 "--workers", "2", "--no-progress")
    assert r.returncode == 0, r.stderr
    check_outputs(tmp_path / "local", want)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    tmp = tempfile.mkdtemp(prefix="nwray", dir="/tmp")     # Ray's socket paths must stay short
    # a loopback cluster of the test's own: no token (whether Ray asks for one depends on what
    # earlier Ray runs left in ~/.ray)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    start = subprocess.run([ray_bin, "start", "--head", "--num-cpus", "2", "--port", "0",
                            "--include-dashboard", "false", f"--temp-dir={tmp}"],
                           capture_output=True, text=True, env=env)
    assert start.returncode == 0, start.stderr
    try:
        address = _address(start.stdout + start.stderr)
        r = nwhisper("batch", str(good), "-o", str(tmp_path / "ray-out"), "-f", "txt,srt,json",
                     "--workers", "2", "--ray", address, "--no-progress",
                     env={"RAY_AUTH_MODE": "disabled"})
        assert r.returncode == 0, r.stderr[-3000:]
        check_outputs(tmp_path / "ray-out", want)
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, env=env)
        shutil.rmtree(tmp, ignore_errors=True)


def _address(text):
    import re
    m = re.search(r"--address='([^']+)'", text) or re.search(r"RAY_ADDRESS=['\"]?([\w.:]+)", text)
    assert m, text
    return m.group(1)
