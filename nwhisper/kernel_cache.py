"""Numba's cache of nwhisper's compiled kernels: where it is kept when the installed package cannot
be written, and how a kernel loads from it.

A wheel carries its kernels compiled at build (nwhisper/precompile.py), in the `__pycache__` beside
each module, where Numba looks first. Where that folder is read-only to the user running nwhisper
(a system-wide install), Numba would fall back to the user's cache folder and compile everything
again; the locator registered here copies a function's shipped files there first, so they load
instead. `NUMBA_CACHE_DIR`, when set, is left to mean exactly that folder: nothing is copied into it.
Wherever it is cached, a kernel loads without Numba first readying everything a compilation needs
(_load_overload): a third of a second of every command.

Imported by nwhisper/__init__.py before any module defines a cached function (Numba picks a
function's cache folder when the function is defined).
"""

import inspect
import os
import shutil
import sys
import tempfile

from numba.core import caching, cpu
from numba.core.runtime import rtsys

PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _shipped_files(shipped, base):
    """The index and data files of one function in a `__pycache__`: {name: path}."""
    try:
        names = os.listdir(shipped)
    except OSError:
        return {}
    return {n: os.path.join(shipped, n) for n in names
            if n == base + ".nbi" or (n.startswith(base + ".") and n.endswith(".nbc"))}


def seed(shipped, cache, base):
    """Copy function `base`'s files from `shipped` into `cache` unless `cache` already holds an
    index at least as new. Data first, the index last and atomically: a process starting at the
    same time sees either no index or one whose data are all there."""
    files = _shipped_files(shipped, base)
    index = files.pop(base + ".nbi", None)
    if index is None:
        return False
    target = os.path.join(cache, base + ".nbi")
    try:
        if os.stat(target).st_mtime >= os.stat(index).st_mtime:
            return False
    except FileNotFoundError:
        pass
    for name, src in sorted(files.items()) + [(base + ".nbi", index)]:
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=name + ".")
        try:
            with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
                shutil.copyfileobj(f, out)
            os.replace(tmp, os.path.join(cache, name))
        except BaseException:
            os.unlink(tmp)
            raise
    return True


class SeededUserWideCacheLocator(caching.UserWideCacheLocator):
    """Numba's user-wide locator, which for a function of this package first copies in what the
    package's own `__pycache__` holds for it (Numba then checks the source's content hash, its own
    version and the CPU as for any cached function, and compiles anew if any differs)."""

    @classmethod
    def from_function(cls, py_func, py_file):
        self = super().from_function(py_func, py_file)
        if self is not None and os.path.abspath(py_file).startswith(PACKAGE + os.sep):
            module = os.path.splitext(os.path.basename(py_file))[0]
            base = "%s.%s-%s.py%d%d%s" % (module, py_func.__qualname__, self.get_disambiguator(),
                                         sys.version_info[0], sys.version_info[1],
                                         getattr(sys, "abiflags", ""))
            try:
                seed(os.path.join(os.path.dirname(py_file), "__pycache__"), self.get_cache_path(), base)
            except OSError:
                pass        # the function compiles as it would have without a shipped copy
        return self


def _load_overload(self, sig, target_context):
    """Numba's Cache.load_overload for nwhisper's CPU functions, without refreshing the target
    context first: that refresh imports and installs every typing and lowering registry (~0.3 s,
    a fifth of a cold command) so that code can be compiled; machine code loaded from the cache
    needs only Numba's runtime (NRT) in place, and a parallel launcher's thread pool, which its
    own reload hook starts. Any compilation still refreshes the context before it begins."""
    if not (isinstance(target_context, cpu.CPUContext) and _ours(self._py_func)):
        return _numba_load_overload(self, sig, target_context)
    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


def _ours(py_func):
    return os.path.abspath(inspect.getfile(py_func)).startswith(PACKAGE + os.sep)


_numba_load_overload = caching.Cache.load_overload


def register():
    """Put the seeded locator in place of Numba's user-wide one, and the loader above in place
    of Numba's (once)."""
    classes = caching.CacheImpl._locator_classes
    if SeededUserWideCacheLocator not in classes:
        classes[classes.index(caching.UserWideCacheLocator)] = SeededUserWideCacheLocator
    caching.Cache.load_overload = _load_overload


register()
