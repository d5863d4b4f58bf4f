"""Fuzz the three container parsers: whatever the bytes, only CheckpointError may escape.

Each parser gets a small valid file (tests/helpers/helpers_models.py) truncated, with bytes overwritten
or inserted, or replaced by random bytes. Hypothesis runs derandomized and without an example
database, so every run (and CI) tries the same inputs.
"""

import os

import pytest

from helpers_models import tiny_random_checkpoint, write_ct2  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nwhisper.io.checkpoint import CheckpointError  # noqa: E402
from nwhisper.io.ct2 import read_ct2  # noqa: E402
from nwhisper.io.ggml import write_ggml, read_ggml  # noqa: E402
from nwhisper.io.safetensors import read_hf, write_hf  # noqa: E402

FUZZ = settings(max_examples=200, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """{container: (directory or file to read, the file inside to mutate, its valid bytes)}."""
    root = tmp_path_factory.mktemp("fuzz")
    ck = tiny_random_checkpoint(tokenizer_dir=str(root))
    ct2 = write_ct2(ck, str(root / "ct2"))
    hf = write_hf(ck, str(root / "hf"))
    gg = write_ggml(ck, str(root / "model.bin"))
    out = {}
    for kind, target, inner in (("ct2", ct2, os.path.join(ct2, "model.bin")),
                                ("hf", hf, os.path.join(hf, "model.safetensors")),
                                ("ggml", gg, gg)):
        with open(inner, "rb") as f:
            out[kind] = (target, inner, f.read())
    return out


READERS = {"ct2": read_ct2, "hf": read_hf, "ggml": read_ggml}


def mutations(header_bytes=4096):
    """A list of edits: (kind, offset fraction, payload). Most land in the first few KB, where
    the headers are; some anywhere."""
    edit = st.tuples(
        st.sampled_from(["overwrite", "insert", "delete", "truncate"]),
        st.one_of(st.integers(0, header_bytes), st.floats(0, 1)),
        st.binary(min_size=1, max_size=8),
    )
    return st.lists(edit, min_size=1, max_size=4)


def apply(blob, edits):
    b = bytearray(blob)
    for kind, where, payload in edits:
        at = min(int(where * len(b)) if isinstance(where, float) else where, len(b))
        if kind == "overwrite":
            b[at:at + len(payload)] = payload
        elif kind == "insert":
            b[at:at] = payload
        elif kind == "delete":
            del b[at:at + len(payload)]
        else:
            del b[at:]
    return bytes(b)


def only_checkpoint_errors(kind, valid, data):
    target, inner, _ = valid[kind]
    with open(inner, "wb") as f:
        f.write(data)
    try:
        READERS[kind](target)
    except CheckpointError as e:
        assert str(e).isprintable(), str(e)      # one printable line


@pytest.fixture
def restore(valid):
    yield
    for target, inner, blob in valid.values():
        with open(inner, "wb") as f:
            f.write(blob)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_mutated_files(kind, valid, restore):
    @FUZZ
    @given(mutations())
    def run(edits):
        only_checkpoint_errors(kind, valid, apply(valid[kind][2], edits))

    run()


@pytest.mark.parametrize("kind", sorted(READERS))
def test_random_bytes(kind, valid, restore):
    # Random bytes, sometimes behind the container's real first bytes so parsing gets further.
    @FUZZ
    @given(st.integers(0, 64), st.binary(max_size=2048))
    def run(keep, noise):
        only_checkpoint_errors(kind, valid, valid[kind][2][:keep] + noise)

    run()
