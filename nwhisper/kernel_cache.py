"""Numba's cache of nwhisper's compiled kernels: where it is kept when the installed package cannot
be written, and how a kernel loads from it.

A wheel carries its kernels compiled at build (nwhisper/precompile.py), in the `__pycache__` beside
each module, where Numba looks first. Where that folder is read-only to the user running nwhisper
(a system-wide install), Numba would fall back to the user's cache folder and compile everything
again; the locator registered here copies a function's shipped files there first, so they load
instead. `NUMBA_CACHE_DIR`, when set, is left to mean exactly that folder: nothing is copied into it.
Wherever it is cached, a kernel loads without Numba first readying everything a compilation needs
(_load_overload): a third of a second of every command.

With an empty cache a first transcription compiles for seconds, one function after another. At a
process's first miss a helper process (ApartCompiler) is sent the functions a first transcription
in the model's compute type loads (FIRST: `python -m nwhisper.kernels` records, for each compute
type, when a first transcription asked for each function and how long each took to compile, and
again for a first transcription that diarizes, whose speaker network runs first; the model tells
which compute type it runs, expect(), and a command that diarizes says so before it loads one,
expect_speakers()) and compiles them ahead into the cache on the
other core, in the order that, replayed on those times, has the process done soonest
(helper_order: a function the process asks for late, after a stretch of running, is best begun
early, where the process would otherwise find the helper still on it). Whoever begins
a function claims it (a file in a folder the two share), and the other does not compile it
too: the process waits for the helper's copy to reach the cache and loads it (where
the two met over one big function, both spent its 1.4 s). The process's exit stops the helper
wherever it is: what it still compiles then, this process did not need. A function the helper
claimed but could not put in the cache is compiled here once the helper has given it up or
left.

Imported by nwhisper/__init__.py before any module defines a cached function (Numba picks a
function's cache folder when the function is defined).
"""

import atexit
import functools
import hashlib
import importlib
import inspect
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time

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
    own reload hook starts. Any compilation still refreshes the context before it begins. A
    function not in the cache is compiled here, unless the helper has begun it (ApartCompiler):
    then it is loaded once the helper has put it in the cache."""
    if not (isinstance(target_context, cpu.CPUContext) and _ours(self._py_func)):
        return _numba_load_overload(self, sig, target_context)
    rtsys.initialize(target_context)
    if _asked is not None:
        _asked.append((_name(self._py_func), repr(tuple(sig)), time.perf_counter()))
    with self._guard_against_spurious_io_errors():
        cres = self._load_overload(sig, target_context)
    if cres is None and _apart():
        helper = ApartCompiler.get()    # at the first miss: FIRST ahead of its turn

        def load():
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        cres = helper.awaited(_name(self._py_func), repr(tuple(sig)), load)
    return cres


APART = "NWHISPER_COMPILE_APART"   # "0": no helper; the process compiles all it needs itself
# The cached functions a first `nwhisper transcribe` loads, per compute type, in order, one a line:
# compute type<TAB>module:name<TAB>repr(types)<TAB>seconds from the first one's asking<TAB>seconds
# to compile
FIRST = os.path.join(PACKAGE, "kernels", "first_functions.txt")
HELPER_START_S = 0.6    # from a first miss to its helper's first compilation (Numba's import)
# The helper runs this much nicer than its process: a parallel launch waits for its slowest
# thread, so a compile that takes a core from the process's kernels delays both of its threads
HELPER_NICE = 10
_asked = None    # while recording(): (module:name, repr(types), when) of each function loaded
_expected = "float32"   # the compute type whose FIRST a helper is sent (expect())
_speakers = False       # ... its list for a transcription that diarizes (expect_speakers())
SPEAKERS = "+speakers"  # FIRST's compute type column for those: "int8+speakers"


def _name(py_func):
    return f"{py_func.__module__}:{py_func.__qualname__}"


def _apart():
    """Whether a helper compiles ahead (not for the helper itself, nor where
    NWHISPER_COMPILE_APART=0)."""
    return os.environ.get(APART, "1") != "0"


class recording:
    """`with recording() as asked:` this package's cached functions loaded meanwhile (from the
    cache or compiled): [(module:name, repr(argument types), time.perf_counter() when asked)],
    each once, in the order loaded."""

    def __enter__(self):
        global _asked
        _asked = []
        return _asked

    def __exit__(self, *exc):
        global _asked
        first = {}
        for name, sig, when in _asked:
            first.setdefault((name, sig), when)
        _asked[:] = [(name, sig, when) for (name, sig), when in first.items()]
        _asked = None


def function(name):
    """The function `module:qualname`."""
    module, _, qualname = name.partition(":")
    return functools.reduce(getattr, qualname.split("."), importlib.import_module(module))


def compile_seconds(name, sig):
    """How long this process took to compile function `name` for `sig` (repr of the types): 0
    where it loaded it from the cache."""
    for types, cres in function(name).overloads.items():
        if repr(tuple(types)) == sig:
            return (cres.metadata or {}).get("timers", {}).get("compiler_lock", 0.0)
    return 0.0


def expect(compute_type):
    """Say which compute type this process's transcriptions run, before any kernel loads (a model
    says so as it begins loading): a helper started at a later first miss is sent that compute
    type's FIRST (the int8 and bfloat16 products, packing and attention are functions float32's
    list lacks)."""
    global _expected
    _expected = compute_type


def expect_speakers():
    """Say, before a model loads, that this process's first transcription diarizes (a command's
    --diarize): its helper is then sent that list, the speaker network's functions first (a
    first `--diarize` compiled them all itself while the helper finished early)."""
    global _speakers
    _speakers = True


def expected():
    """The FIRST list a helper is sent: the expected compute type, SPEAKERS appended where the
    first transcription diarizes."""
    return _expected + SPEAKERS * _speakers


def first_functions(kind=None):
    """FIRST's lines for `kind` (a compute type, or one with SPEAKERS; default: expected()) as
    (module:name, repr(argument types), seconds from the first one's asking, seconds to compile);
    a SPEAKERS kind that was not recorded gives its compute type's; none where it is missing."""
    kind = kind or expected()
    try:
        with open(FIRST, encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t") for line in f if "\t" in line]
    except OSError:
        return []
    first = [(name, sig, float(at), float(cost)) for ct, name, sig, at, cost in rows if ct == kind]
    if not first and kind.endswith(SPEAKERS):
        return first_functions(kind[:-len(SPEAKERS)])
    return first


def finish(first, order, start=HELPER_START_S):
    """When a process that asks for FIRST's functions (`first`: its rows) would have them all,
    replayed on their times, with a helper that begins `order` (indices into `first`) `start`
    seconds after the first ask. Between asks the process runs what it has (the recorded time
    less the compile); a function is the process's own if it asks before the helper begins it,
    else it waits for the helper's copy."""
    begun = {}          # index -> when the helper or the process began it
    helper, j, t = start, 0, 0.0
    for i, (_, _, at, cost) in enumerate(first):
        while j < len(order) and helper <= t:
            k = order[j]
            j += 1
            if k not in begun:
                begun[k] = helper
                helper += first[k][3]
        if i in begun:          # the helper's: ready when it is done
            t = max(t, begun[i] + cost)
        else:
            begun[i] = t
            t += cost
        if i + 1 < len(first):
            t += max(0.0, first[i + 1][2] - at - cost)
    return t


def helper_order(first):
    """The order for the helper to compile `first` in (indices): from the last back, then each
    function moved wherever moving it brings finish() sooner, until none does."""
    order = list(range(len(first)))[::-1]
    best = finish(first, order)
    moved = True
    while moved:
        moved = False
        for a in range(len(order)):
            for b in range(len(order)):
                trial = order[:a] + order[a + 1:]
                trial.insert(b, order[a])
                t = finish(first, trial)
                if t < best - 1e-9:
                    order, best, moved = trial, t, True
    return order


# The helper: compiles the functions it is sent, (module:name, repr(types)) each, into the cache
# in that order, each unless the process has claimed it (one that no longer exists or no longer
# types is skipped), then leaves
_HELPER = f"""
import os, pickle, sys
os.environ[{APART!r}] = "0"
sys.path.insert(0, sys.argv[1])
try:
    os.nice({HELPER_NICE})
except (AttributeError, OSError):
    pass                    # no os.nice here: the helper runs as the process does
from numba.core import types
from numba.np.ufunc.parallel import _launch_threads
from nwhisper.kernel_cache import claim, function, unclaim
from nwhisper.kernels import blas
blas.register_symbol()      # the GEMM loops' call into OpenBLAS links to it
_launch_threads()           # so do get_thread_id's callers to Numba's threading layer, in any order

try:
    ahead = pickle.load(sys.stdin.buffer)
except EOFError:            # the process has gone
    ahead = []
for name, sig in ahead:
    if not claim(sys.argv[2], name, sig):
        continue            # the process compiles it, or has
    try:
        function(name).compile(eval(sig, dict(vars(types), bool=types.boolean)))
    except Exception:
        unclaim(sys.argv[2], name, sig)
"""


class ApartCompiler:
    """One helper process per process, started at its first function missing from the cache and
    sent FIRST's functions for the expected compute type to compile ahead (it imports Numba once;
    each compilation then costs what it would have cost here); it leaves when it has been through
    them."""

    _one = None
    _lock = threading.Lock()

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._one is None:
                cls._one = cls()
            return cls._one

    def __init__(self):
        self.claims = tempfile.mkdtemp(prefix="nwhisper-claims-")
        self.proc = subprocess.Popen([sys.executable, "-c", _HELPER, os.path.dirname(PACKAGE),
                                      self.claims], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        first = first_functions()
        try:
            pickle.dump([first[k][:2] for k in helper_order(first)], self.proc.stdin)
            self.proc.stdin.close()
        except OSError:
            pass        # it has gone already: this process compiles what it needs
        atexit.register(self.close)

    def close(self):
        """At exit: whatever the helper still compiles is ahead of any need (FIRST's rest): it is
        stopped, not awaited (a first command's exit waited up to 1.6 s for it). Numba writes a
        cache file under a temporary name and renames it: a compile cut short leaves nothing
        half-written."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.claims, ignore_errors=True)

    def awaited(self, name, sig, load):
        """What load() gives once the helper has compiled function `name` for `sig` (repr of the
        types) ahead, if it has begun it; None where this process is to compile it: nobody had
        begun it (it is claimed for this process now), or the helper gave it up or went."""
        path = _claim_path(self.claims, name, sig)
        if claim(self.claims, name, sig):
            return None
        while self.proc.poll() is None and os.path.exists(path):
            cres = load()
            if cres is not None:
                return cres
            time.sleep(CLAIM_POLL_S)
        return load()


CLAIM_POLL_S = 0.01     # how often a process waiting for its helper's compile looks for it


def _claim_path(claims, name, sig):
    return os.path.join(claims, hashlib.sha1(f"{name}|{sig}".encode()).hexdigest())


def claim(claims, name, sig):
    """Whether this process is the first to claim compiling `name` for `sig` (repr of the
    types, as FIRST writes them): the process and its helper never both compile one function
    (each would spend the same seconds on it; a first command's last big function was)."""
    try:
        os.close(os.open(_claim_path(claims, name, sig), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True         # no claims folder (it has gone): compile as before


def unclaim(claims, name, sig):
    try:
        os.remove(_claim_path(claims, name, sig))
    except OSError:
        pass


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
