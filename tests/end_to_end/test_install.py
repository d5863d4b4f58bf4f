"""A fresh, read-only install: the package copied without any compiled cache, its kernels compiled
into it as a wheel's build does (`python -m nwhisper.precompile`, here float32 only), every file and
folder made read-only, and two processes started on it at once — `nwhisper transcribe` and
`nwhisper serve` answering a request. Both must give jfk.wav's sentence; nothing may appear under
the package; and nothing may be compiled: every file in the user's Numba cache is a copy of one
the package shipped (nwhisper/kernel_cache.py copies them there, as the package's own folders
cannot be written).

The processes run as root without the capabilities that let root write where permissions say
no (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER; dropped from the bounding set before
exec), so a read-only folder is read-only to them as it is to any other user. Truth: the
sentence tests/oracle/test_transcribe.py checks against HF transformers."""

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys

from paths import ROOT
from server_process import JFK, JFK_WORDS, Server, inference

PR_CAPBSET_DROP = 24
OVERRIDES = (1, 2, 3)   # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def _as_any_user():
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in OVERRIDES:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and os.geteuid() == 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")


def _tree(top):
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, files in os.walk(top) for f in files)


def test_a_read_only_fresh_install_transcribes_and_serves_in_two_processes_at_once(tmp_path):
    site, home = tmp_path / "site", tmp_path / "home"
    shutil.copytree(os.path.join(ROOT, "nwhisper"), site / "nwhisper",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CACHE_DIR", "PYTHONPATH"))}
    env.update(PYTHONPATH=str(site), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    subprocess.run([sys.executable, "-m", "nwhisper.precompile", "--compute-types", "float32"],
                   env=dict(env, HOME=str(tmp_path / "builder"), XDG_CACHE_HOME=str(tmp_path / "builder")),
                   cwd=tmp_path, capture_output=True, check=True, timeout=600)
    shipped = {os.path.basename(p): os.path.join(site, p) for p in _tree(site) if p.endswith((".nbi", ".nbc"))}
    assert len(shipped) > 40, sorted(shipped)
    before = _tree(site)
    for d, dirs, files in os.walk(site):
        for name in dirs + files:
            path = os.path.join(d, name)
            os.chmod(path, os.stat(path).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    os.chmod(site, 0o555)
    probe = subprocess.run([sys.executable, "-c", "import nwhisper; print(nwhisper.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
                           preexec_fn=_as_any_user)
    assert probe.stdout.startswith(str(site)), probe.stdout     # the copy, not the checkout
    server = None
    try:
        server = Server(str(tmp_path), "fresh", "tiny.en", env=env, cwd=tmp_path,
                        preexec_fn=_as_any_user)
        cli = subprocess.Popen([sys.executable, "-m", "nwhisper", "transcribe", "tiny.en", JFK],
                               env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=_as_any_user)
        out, err = cli.communicate(timeout=300)
        assert cli.returncode == 0, err[-3000:]
        assert JFK_WORDS in out.lower(), out
        server.wait(timeout=300)
        status, _, body = inference(server.url, [("response_format", "json")])
        assert status == 200, body
        assert JFK_WORDS in json.loads(body)["text"].lower()
        server.stop()
        assert server.proc.returncode == 0, server.output()     # a clean exit on SIGTERM
    finally:
        if server is not None:
            server.stop()
        for d, dirs, files in os.walk(site):
            os.chmod(d, 0o755)
    assert _tree(site) == before, "something was written under the installed package"
    cached = {os.path.basename(p): os.path.join(home, p) for p in _tree(home) if p.endswith((".nbi", ".nbc"))}
    compiled = [name for name, p in cached.items()
                if name not in shipped or open(p, "rb").read() != open(shipped[name], "rb").read()]
    assert not compiled, f"compiled on a first run although the package shipped its kernels: {compiled}"
    assert len(cached) > 40, f"only {sorted(cached)} were copied to the user's cache"
