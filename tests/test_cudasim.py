"""The CUDA backend without a GPU: every op under Numba's CUDA simulator against the CPU backend,
and every kernel body through the real CUDA compiler (PTX, no device needed) when NVVM is here.

Truth: the CPU backend, itself checked against NumPy in test_kernels.py. The simulator must be
enabled before numba is imported, so tests/cudasim_check.py runs in a subprocess.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHECK = os.path.join(HERE, "cudasim_check.py")

pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (the [cuda] extra)")
pytestmark = pytest.mark.cudasim


def run_check(args, simulator):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run([sys.executable, CHECK, *args], env=env, capture_output=True, text=True,
                          timeout=600)
    reports = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert reports, f"no REPORT line (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc, json.loads(reports[-1][len("REPORT "):])


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    sigs = tmp_path_factory.mktemp("cudasim") / "signatures.json"
    proc, report = run_check(["--signatures", str(sigs)], simulator=True)
    return proc, report, sigs


def test_every_op_matches_cpu_under_the_simulator(simulated):
    proc, report, _ = simulated
    print(proc.stdout)
    assert proc.returncode == 0 and not report["failed"], (
        f"cases differing from the CPU backend: {report['failed']}\n{proc.stdout}\n{proc.stderr[-3000:]}")
    worst = max(report["cases"].values())
    assert worst <= 5e-6, f"max relative |Δ| {worst:.3g}"


def test_every_body_runs_under_the_simulator(simulated):
    from nwhisper.kernels import _compile
    _, report, _ = simulated
    missing = sorted(set(_compile.bodies()) - set(report["bodies"]))
    assert not missing, f"kernel bodies no simulator case launches: {missing}"


def test_bodies_compile_for_cuda_without_float64(simulated):
    nvvm = pytest.importorskip("numba.cuda.cudadrv.nvvm")
    if not nvvm.is_available():
        pytest.skip("NVVM is not installed (pip install 'numba-cuda[cu13]')")
    _, _, sigs = simulated
    proc, report = run_check(["--ptx", str(sigs)], simulator=False)
    print(proc.stdout)
    assert not report["errors"], f"bodies the CUDA compiler rejects: {report['errors']}"
    assert not report["f64"], f"bodies whose PTX computes in float64: {report['f64']}"
    assert report["compiled"] > 0
