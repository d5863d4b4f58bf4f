"""The CUDA backend without a GPU: every op under Numba's CUDA simulator against the CPU backend,
and every kernel body through the real CUDA compiler (PTX, no device needed) when NVVM is here.

Truth: the CPU backend, itself checked against NumPy in test_kernels.py. The simulator must be
enabled before numba is imported, so tests/helpers/cudasim_check.py runs in a subprocess.
"""

import json
import os
import subprocess
import sys

import pytest

from paths import HELPERS, env as path_env

CHECK = os.path.join(HELPERS, "cudasim_check.py")

import numba_cuda  # noqa: F401  (the test extra installs it: a missing one fails here, never skips)
pytestmark = pytest.mark.cudasim


PARTS = 2       # processes at once: the simulator runs one Python thread per CUDA thread, on one core


def _env(simulator):
    env = path_env()
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return env


def _report(proc, stdout, stderr):
    reports = [line for line in stdout.splitlines() if line.startswith("REPORT ")]
    assert reports, f"no REPORT line (exit {proc.returncode}):\n{stdout}\n{stderr[-3000:]}"
    return json.loads(reports[-1][len("REPORT "):])


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """The simulator's cases in PARTS processes side by side, their reports and the argument
    types of every launch merged."""
    d = tmp_path_factory.mktemp("cudasim")
    share = d / "claims"
    share.mkdir()
    procs = [subprocess.Popen([sys.executable, CHECK, "--signatures", str(d / f"sig{k}.json"), "--share", str(share)],
                              env=_env(True), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(PARTS)]
    outs = [p.communicate(timeout=600) for p in procs]
    reports = [_report(p, out, err) for p, (out, err) in zip(procs, outs)]
    report = {"cases": {}, "failed": [], "bodies": set()}
    signatures = {}
    for k, r in enumerate(reports):
        report["cases"].update(r["cases"])
        report["failed"] += r["failed"]
        report["bodies"] |= set(r["bodies"])
        for body, sigs in json.loads((d / f"sig{k}.json").read_text()).items():
            signatures.setdefault(body, []).extend(x for x in sigs if x not in signatures.get(body, []))
    sigs = d / "signatures.json"
    sigs.write_text(json.dumps(signatures))
    returncode = max(p.returncode for p in procs)
    return returncode, "".join(out for out, _ in outs), "".join(err for _, err in outs), report, sigs


def test_every_op_matches_cpu_under_the_simulator(simulated):
    returncode, stdout, stderr, report, _ = simulated
    print(stdout)
    assert returncode == 0 and not report["failed"], (
        f"cases differing from the CPU backend: {report['failed']}\n{stdout}\n{stderr[-3000:]}")
    worst = max(report["cases"].values())
    assert worst <= 5e-6, f"max relative |Δ| {worst:.3g}"


def test_every_body_runs_under_the_simulator(simulated):
    from nwhisper.kernels import _compile
    report = simulated[3]
    missing = sorted(set(_compile.bodies()) - set(report["bodies"]))
    assert not missing, f"kernel bodies no simulator case launches: {missing}"


def test_bodies_compile_for_cuda_without_float64(simulated):
    from numba.cuda.cudadrv import nvvm
    assert nvvm.is_available(), "NVVM is not installed: the test extra's numba-cuda[cu13] brings it"
    sigs = simulated[4]
    procs = [subprocess.Popen([sys.executable, CHECK, "--ptx", str(sigs), str(k), str(PARTS)], env=_env(False),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(PARTS)]
    reports = [_report(p, *p.communicate(timeout=600)) for p in procs]
    errors = {label: e for r in reports for label, e in r["errors"].items()}
    f64 = [label for r in reports for label in r["f64"]]
    assert not errors, f"bodies the CUDA compiler rejects: {errors}"
    assert not f64, f"bodies whose PTX computes in float64: {f64}"
    assert all(r["compiled"] > 0 for r in reports)
