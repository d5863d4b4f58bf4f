"""Where things are, for the tests and the processes they start: the repository, the fixtures,
the golden files, and an environment whose Python finds nwhisper and these helpers."""

import json
import os

import numpy as np

HELPERS = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HELPERS)
ROOT = os.path.dirname(TESTS)
FIXTURES = os.path.join(ROOT, "fixtures")
GOLDEN = os.path.join(FIXTURES, "golden")


def fixture(*parts):
    """The path of a file under fixtures/."""
    return os.path.join(FIXTURES, *parts)


def golden(name):
    """A golden file of fixtures/golden/: a .json's data, an .npz's arrays."""
    path = os.path.join(GOLDEN, name)
    if name.endswith(".npz"):
        return np.load(path)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def env(base=None, **extra):
    """os.environ (or `base`) with nwhisper, tests/helpers and fixtures/ on PYTHONPATH: what a
    subprocess needs to import what a test does."""
    e = dict(os.environ if base is None else base, **extra)
    e["PYTHONPATH"] = os.pathsep.join([ROOT, HELPERS, FIXTURES] + [p for p in [e.get("PYTHONPATH")] if p])
    return e
