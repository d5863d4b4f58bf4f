"""`python -m nwhisper.kernels`: rewrite the generated launcher modules from the kernel bodies,
then the list of cached functions a first transcription loads in each compute type this CPU runs
(kernel_cache.FIRST), with when each was asked for and what it took to compile, and each again
for a first transcription that diarizes (where the speaker weights are installed), each recorded
in a process of its own (the launchers as just written, nothing loaded before, an empty cache,
no compile helper)."""

import os
import subprocess
import sys
import tempfile

from nwhisper import kernel_cache
from nwhisper.kernels import _compile

for target in ("cpu", "cuda"):
    _compile.write(target)
    print(f"wrote {_compile.path(target)}")
lines = []
compute_types = subprocess.run([sys.executable, "-c", "from nwhisper.precompile import default_compute_types; "
                                "print(*default_compute_types())"], check=True, capture_output=True, text=True).stdout
# asked of a process of its own as the compute types are (the kernels' room imports no speakers)
diarizes = subprocess.run([sys.executable, "-c", "from nwhisper.speakers.weights import installed; "
                           "print(installed() is not None)"], check=True, capture_output=True,
                          text=True).stdout.strip() == "True"
if not diarizes:
    print("the speaker weights are not installed: no lists for --diarize (kernel_cache.SPEAKERS)")
for speakers in (False, True) if diarizes else (False,):
    for compute_type in compute_types.split():
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache, **{kernel_cache.APART: "0"})
            lines.append(subprocess.run([sys.executable, "-c", "from nwhisper.precompile import record_first; "
                                         f"print(record_first({compute_type!r}, {speakers}), end='')"],
                                        check=True, capture_output=True, text=True, env=env).stdout)
with open(kernel_cache.FIRST, "w", encoding="utf-8") as f:
    f.write("".join(lines))
print(f"wrote {kernel_cache.FIRST}")
