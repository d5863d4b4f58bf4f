"""What a batch is: the recordings to transcribe, where each one's outputs go, and when a
recording counts as done.

    jobs = collect(["talks/", "extra.m4a", "list.csv"])    # → [Job(path, stem, language)]
    outputs(job, "out", ("srt", "json"))                   # → ["out/talks/a.srt", "out/talks/a.json"]
    done(job, "out", fmts)                                 # every output is there
    write_outputs(job, "out", fmts, texts)                 # each written whole or not at all

An input is a file, a folder (searched recursively for AUDIO_EXTENSIONS) or a manifest: a text
file with one path per line (`.txt`, `.lst`; `#` starts a comment), a CSV with a `path` column
(and optionally `language`), or JSON lines with "path" (and "language"). A manifest's relative
paths are relative to the manifest.

Outputs keep the layout of the inputs: a file found in a folder lands at the same relative path
under OUTDIR (so `a/x.wav` and `b/x.wav` do not collide); a file named directly, or in a
manifest, at its base name. Two recordings that would write the same output are refused before
anything runs. Each output is written to a temporary name in OUTDIR and renamed into place, so a
file that looks finished is finished; a recording is done when all its outputs exist, and a rerun
skips it.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from dataclasses import dataclass

AUDIO_EXTENSIONS = frozenset(
    "wav flac mp3 ogg oga opus m4a mp4 m4v mov mkv mka webm wma aac ac3 amr aiff aif aifc "
    "caf au snd w64 rf64 wv mpga mpeg mpg 3gp 3g2 ts mts avi flv".split())
MANIFEST_EXTENSIONS = frozenset({"txt", "lst", "csv", "jsonl"})
PART = ".part"               # an output being written (never mistaken for a finished one)


class BatchError(ValueError):
    """Inputs that cannot make a batch: the message says which and why."""


@dataclass(frozen=True)
class Job:
    path: str                  # the recording
    stem: str                  # its outputs' path under OUTDIR, without the extension
    language: str | None = None


def _ext(path):
    return os.path.splitext(path)[1].lower().lstrip(".")


def collect(inputs):
    """The jobs of every input, in a stable order; BatchError for what cannot be used."""
    jobs = []
    for item in inputs:
        if os.path.isdir(item):
            jobs += _folder(item)
        elif not os.path.exists(item):
            raise BatchError(f"{item}: no such file or folder")
        elif _ext(item) in MANIFEST_EXTENSIONS:
            jobs += _manifest(item)
        else:
            jobs.append(Job(item, _stem(os.path.basename(item))))
    seen = {}
    for j in jobs:
        other = seen.setdefault(j.stem, j.path)
        if other != j.path:
            raise BatchError(f"{other} and {j.path} would both write {j.stem}.*: give them "
                             f"from their folder, or rename one")
    unique = {j.stem: j for j in jobs}     # the same file named twice runs once
    return list(unique.values())


def _stem(rel):
    return os.path.splitext(rel)[0]


def _folder(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if _ext(name) in AUDIO_EXTENSIONS and not name.startswith("."):
                path = os.path.join(dirpath, name)
                found.append(Job(path, _stem(os.path.relpath(path, root))))
    return found


def _manifest(path):
    base = os.path.dirname(os.path.abspath(path))
    rows = []
    with open(path, encoding="utf-8") as f:
        if _ext(path) == "csv":
            reader = csv.DictReader(f)
            if not reader.fieldnames or "path" not in reader.fieldnames:
                raise BatchError(f"{path}: a CSV manifest needs a 'path' column (and optionally "
                                 f"'language'); it has {reader.fieldnames}")
            rows = [(r["path"], r.get("language")) for r in reader]
        elif _ext(path) == "jsonl":
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except ValueError as e:
                    raise BatchError(f"{path}:{n}: not JSON: {e}") from None
                if not isinstance(r, dict) or not isinstance(r.get("path"), str):
                    raise BatchError(f"{path}:{n}: each line is an object with a \"path\"")
                rows.append((r["path"], r.get("language")))
        else:
            rows = [(line.strip(), None) for line in f
                    if line.strip() and not line.lstrip().startswith("#")]
    jobs = []
    for p, lang in rows:
        p = p.strip()
        if not p:
            continue
        full = p if os.path.isabs(p) else os.path.join(base, p)
        jobs.append(Job(full, _stem(os.path.basename(p)), (lang or "").strip() or None))
    return jobs


def outputs(job, outdir, fmts):
    return [os.path.join(outdir, f"{job.stem}.{fmt}") for fmt in fmts]


def done(job, outdir, fmts):
    return all(os.path.exists(p) for p in outputs(job, outdir, fmts))


def write_outputs(job, outdir, fmts, texts):
    """Write each format's text (texts[fmt]) whole: to a temporary file beside it, then renamed."""
    paths = outputs(job, outdir, fmts)
    os.makedirs(os.path.dirname(paths[0]) or ".", exist_ok=True)
    for fmt, path in zip(fmts, paths):
        _remove_stale_parts(path)
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=PART,
                                   dir=os.path.dirname(path) or ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(texts[fmt])
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return paths


def _remove_stale_parts(path):
    """A run killed while writing `path` left `<name>.<random>.part`: it goes before the rewrite."""
    folder, name = os.path.split(path)
    for other in os.listdir(folder or "."):
        if other.startswith(name + ".") and other.endswith(PART):
            os.unlink(os.path.join(folder, other))
