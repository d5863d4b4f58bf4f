"""What many test files share: the models, loaded once per session.

Layout: unit/ (pure logic, parsers, kernels against float64 references), oracle/ (stages against
independent implementations and their golden files), cuda/ (the CUDA backend under Numba's
simulator and its launcher), end_to_end/ (servers, streams, the page, the batch command, as
processes on loopback). helpers/ and fixtures/ are on the import path (pyproject's pytest
`pythonpath`)."""

import pytest

import nwhisper


@pytest.fixture(scope="session")
def models():
    """models(name, compute_type="float32"): a CPU model, loaded once for the whole session."""
    loaded = {}

    def get(name, compute_type="float32"):
        key = (name, compute_type)
        if key not in loaded:
            loaded[key] = nwhisper.load(name, device="cpu", compute_type=compute_type)
        return loaded[key]
    return get
