"""setuptools' build, with one step added: a wheel carries its CPU kernels compiled (an editable
install does not: its kernels compile into the checkout as they are first called)."""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_with_kernels(build_py):
    """After the package's files are in build_lib, run nwhisper.precompile from there, so that
    Numba's cache lands in build_lib's `__pycache__` folders and goes into the wheel. A failure is
    reported and the build goes on: the package then compiles its kernels on first use."""

    def run(self):
        super().run()
        if self.editable_mode or os.environ.get("NWHISPER_PRECOMPILE", "1") == "0":
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE_DIR")}
        env["PYTHONPATH"] = os.path.abspath(self.build_lib)
        done = subprocess.run([sys.executable, "-m", "nwhisper.precompile"], env=env, cwd=self.build_lib)
        if done.returncode != 0:
            print("nwhisper: compiling the kernels at build failed; they will compile on first use",
                  file=sys.stderr)


setup(cmdclass={"build_py": build_py_with_kernels})
