"""Every model by its name, from the caches users already have (io/registry.py).

Truth: the layouts are huggingface_hub's (models--OWNER--REPO/refs/main → snapshots/REV, as
faster-whisper and transformers leave them) and openai-whisper's ($XDG_CACHE_HOME/whisper/NAME.pt);
the weights put there are the installed tiny.en's (a CTranslate2 copy, a Hugging Face copy made by
`nwhisper convert`, a .pt that torch and openai-whisper read: test_pt.py), so a name resolved
from a cache must transcribe exactly as tiny.en loaded from its own directory does.
"""

import os

import pytest
from fixture_audio import audio

import nwhisper
from nwhisper.io.checkpoint import CheckpointError
from nwhisper.io.convert import convert
from nwhisper.io.registry import resolve


@pytest.fixture
def caches(tmp_path, monkeypatch):
    hub, xdg = tmp_path / "hub", tmp_path / "xdg"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.delenv("HF_HOME", raising=False)
    return hub, xdg


def snapshot(hub, repo, rev="0123abcd"):
    d = hub / ("models--" + repo.replace("/", "--"))
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text(rev)
    snap = d / "snapshots" / rev
    snap.mkdir(parents=True)
    return snap


def ct2_copy(snap):
    """The installed tiny.en's CTranslate2 files, linked as the hub links its blobs."""
    src = resolve("tiny.en").path
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), snap / f)


@pytest.fixture(scope="module")
def reference():
    return "".join(s.text for s in nwhisper.load("tiny.en").transcribe(audio("jfk.wav"))[0])


def text(name):
    return "".join(s.text for s in nwhisper.load(name).transcribe(audio("jfk.wav"))[0])


def test_faster_whispers_cache_is_used_in_place(caches, reference):
    hub, _ = caches
    snap = snapshot(hub, "Systran/faster-whisper-medium.en")
    ct2_copy(snap)
    src = resolve("medium.en")
    assert (src.container, src.path) == ("ct2", str(snap))
    assert text("medium.en") == reference


def test_transformers_cache_and_any_repo_id(caches, reference):
    hub, _ = caches
    convert("tiny.en", snapshot(hub, "openai/whisper-small.en"), to="hf")
    assert resolve("small.en").container == "hf" and text("small.en") == reference
    convert("tiny.en", snapshot(hub, "someone/whisper-tiny-finetune"), to="hf")
    assert resolve("someone/whisper-tiny-finetune").container == "hf"


def test_openai_whispers_cache_and_the_order(caches, reference):
    hub, xdg = caches
    (xdg / "whisper").mkdir(parents=True)
    convert("tiny.en", xdg / "whisper" / "large-v3-turbo.pt", to="pt")
    assert resolve("turbo").container == "pt" and resolve("large-v3-turbo").container == "pt"
    assert text("turbo") == reference
    ct2_copy(snapshot(hub, "mobiuslabsgmbh/faster-whisper-large-v3-turbo"))
    assert resolve("turbo").container == "ct2"            # the Hugging Face cache comes first


def test_an_incomplete_copy_is_passed_over_and_the_error_says_where_to_look(caches):
    hub, xdg = caches
    snap = snapshot(hub, "Systran/faster-whisper-large-v3")
    (snap / "config.json").write_text("{}")               # an interrupted download: no model.bin
    with pytest.raises(CheckpointError) as e:
        resolve("large-v3")
    message = str(e.value)
    assert "Systran/faster-whisper-large-v3" in message and str(hub) in message
    assert os.path.join(str(xdg), "whisper", "large-v3.pt") in message
    with pytest.raises(CheckpointError, match="not a model name"):
        resolve("no-such-model")
