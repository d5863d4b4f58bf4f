"""A model that is nowhere on this machine, fetched from the Hugging Face Hub.

    src = locate("large-v3")                 # registry.resolve, else a download (said on stderr)
    src = pull("large-v3")                   # `nwhisper models pull`: fetch ahead of time
    src = locate("large-v3", offline=True)   # never the network: a clear error names what is missing

huggingface_hub names the files (its API, its token, HF_ENDPOINT); they land in its cache
($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub) in its layout, under its locks, so
faster-whisper and transformers find what nwhisper fetched and the other way round. It honours
HF_HUB_OFFLINE and HF_HUB_DOWNLOAD_TIMEOUT, resumes an interrupted file, shows a progress bar,
and takes only the files a container needs. A published name comes from
faster-whisper's CTranslate2 repo (what `WhisperModel(name)` downloads); an `owner/repo` id from
whichever container it holds. A file lands in the snapshot only once it is whole, and the
registry counts a snapshot as a model only when every file the reader needs is there, so an
interrupted pull is never taken for a model.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import sys
import urllib.error
import urllib.request

from .checkpoint import CheckpointError
from .registry import PUBLISHED, Source, complete_snapshot, hub_cache, is_repo_id, resolve

DEFAULT_ENDPOINT = "https://huggingface.co"
DOWNLOAD_TIMEOUT_S = 10            # huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT default
CHUNK = 1 << 20

# the files each container's reader uses (faster-whisper's own list for CTranslate2)
CT2_FILES = ["config.json", "preprocessor_config.json", "model.bin", "tokenizer.json", "vocabulary.*"]
HF_FILES = ["config.json", "generation_config.json", "preprocessor_config.json", "model.safetensors",
            "tokenizer.json"]


def offline_by_default():
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, as huggingface_hub reads it."""
    return any(os.getenv(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def say_on_stderr(line):
    """How a fetch tells the user what it is doing (on stderr: stdout is the transcript)."""
    print(f"nwhisper: {line}", file=sys.stderr, flush=True)


def endpoint():
    return (os.getenv("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def repo_of(name):
    """The repo a name downloads from, or None when it is not a model name."""
    if name in PUBLISHED:
        return PUBLISHED[name][0]
    return name if is_repo_id(name) else None


def locate(name_or_path, offline=None, say=None):
    """The Source of a model: found here (registry.resolve), else downloaded."""
    try:
        return resolve(name_or_path)
    except CheckpointError as e:
        repo = name_or_path and repo_of(name_or_path)
        if repo is None:
            raise
        offline = offline_by_default() if offline is None else offline
        if offline:
            raise CheckpointError(name_or_path, f"not here, and offline (--offline or HF_HUB_OFFLINE=1) "
                                                f"nothing is downloaded: {e.problem}") from None
    return pull(name_or_path, say=say)


def pull(name, say=None):
    """Download `name` into the Hugging Face cache (what is already whole there is kept) and
    return its Source. Errors are CheckpointErrors of one line."""
    say = say or say_on_stderr
    repo = repo_of(name)
    if repo is None:
        raise CheckpointError(name, "not a model name or a Hugging Face owner/repo")
    try:
        import huggingface_hub as hf
        from huggingface_hub import errors as E
    except ImportError:
        raise CheckpointError(name, "downloading needs huggingface_hub: pip install huggingface_hub") from None
    where, cache = endpoint(), hub_cache()
    token = os.getenv("HF_TOKEN") or hf.get_token()
    try:
        info = hf.HfApi(endpoint=where, token=token).model_info(repo, files_metadata=True)
        wanted = _choose(name, repo, {s.rfilename for s in info.siblings or []})
        files = sorted((s for s in info.siblings if _matches(s.rfilename, wanted)), key=lambda s: s.size or 0)
        say(f"{name}: downloading {repo} from {where} ({sum(s.size or 0 for s in files) / 1e6:.0f} MB) "
            f"into {cache}")
        snap = _fetch(repo, info.sha, files, cache, where, token)
    except E.GatedRepoError:
        raise CheckpointError(name, f"{repo} on {where} is gated: accept its terms on the Hub and "
                                    f"set HF_TOKEN") from None
    except E.RepositoryNotFoundError:
        raise CheckpointError(name, f"no repository {repo} on {where} (or it is private: set "
                                    f"HF_TOKEN)") from None
    except urllib.error.HTTPError as e:
        raise CheckpointError(name, f"downloading {repo} from {where} failed: "
                                    f"{e.url.rsplit('/', 1)[-1]}: HTTP {e.code} {e.reason}") from None
    except E.HfHubHTTPError as e:
        raise CheckpointError(name, f"downloading {repo} from {where} failed: {_line(e)}") from None
    except CheckpointError:
        raise
    except OSError as e:                     # unreachable, reset, stalled, a short or wrong file
        raise CheckpointError(name, f"downloading {repo} from {where} failed ({type(e).__name__}: "
                                    f"{_line(e)}); run it again to resume") from None
    except Exception as e:                   # huggingface_hub's HTTP library's own errors
        if type(e).__module__.split(".")[0] not in ("httpx", "httpx2", "requests", "urllib3"):
            raise
        raise CheckpointError(name, f"reaching {where} failed ({type(e).__name__}: {_line(e)})") from None
    src = complete_snapshot(snap)
    if src is None:
        raise CheckpointError(name, f"{repo}'s download at {snap} is not a whole model")
    say(f"{name}: {src.container} {src.path}")
    return Source(name, src.container, src.path, src.parts, src.meta_dir)


def _fetch(repo, sha, files, cache, where, token):
    """The files of commit `sha` into huggingface_hub's layout: blobs/ETAG (an LFS file's sha256,
    else its git blob id, as the Hub's ETag), snapshots/SHA/FILE linking to it, refs/main last.
    A blob grows in blobs/ETAG.incomplete, so a pull cut short resumes with a Range request
    (huggingface_hub 2.x starts each file over in a temporary of its own process); it is checked
    (size, sha256) before it is moved into place. Its lock is huggingface_hub's, so the two
    never write one file at once."""
    from filelock import FileLock
    from huggingface_hub import hf_hub_url

    folder = "models--" + repo.replace("/", "--")
    storage, locks = os.path.join(cache, folder), os.path.join(cache, ".locks", folder)
    snap = os.path.join(storage, "snapshots", sha)
    for d in (os.path.join(storage, "blobs"), snap, os.path.join(storage, "refs"), locks):
        os.makedirs(d, exist_ok=True)
    for f in files:
        etag = f.lfs.sha256 if f.lfs else f.blob_id
        blob = os.path.join(storage, "blobs", etag)
        with FileLock(os.path.join(locks, etag + ".lock")):
            if not os.path.isfile(blob):
                url = hf_hub_url(repo, f.rfilename, revision=sha, endpoint=where)
                _download(url, blob + ".incomplete", f.size, f.lfs.sha256 if f.lfs else None, token, f.rfilename)
                os.replace(blob + ".incomplete", blob)
        link = os.path.join(snap, f.rfilename)
        if not os.path.lexists(link):
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    with open(os.path.join(storage, "refs", "main.tmp"), "w") as out:
        out.write(sha)
    os.replace(os.path.join(storage, "refs", "main.tmp"), os.path.join(storage, "refs", "main"))
    return snap


def _download(url, part, size, sha256, token, label):
    """`url` appended to `part` from where it stops; its size and sha256 checked."""
    from tqdm.auto import tqdm

    have = os.path.getsize(part) if os.path.exists(part) else 0
    if size is not None and have > size:
        os.remove(part)
        have = 0
    if size is None or have < size:
        request = urllib.request.Request(url, headers={"User-Agent": "nwhisper"})
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        if have:
            request.add_header("Range", f"bytes={have}-")
        timeout = float(os.getenv("HF_HUB_DOWNLOAD_TIMEOUT") or DOWNLOAD_TIMEOUT_S)
        quiet = os.getenv("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().upper() in ("1", "ON", "YES", "TRUE")
        with urllib.request.urlopen(request, timeout=timeout) as r, open(part, "ab") as out, \
                tqdm(total=size, initial=have, unit="B", unit_scale=True, desc=label, disable=quiet,
                     leave=False) as bar:
            if have and r.status != 206:            # the server ignored the range: start over
                out.truncate(0)
                bar.reset()
            while piece := r.read(CHUNK):
                out.write(piece)
                bar.update(len(piece))
    got = os.path.getsize(part)
    if size is not None and got != size:
        raise OSError(f"{label}: {got} bytes arrived, the Hub lists {size}")
    if sha256 is not None and _sha256(part) != sha256:
        os.remove(part)                             # wrong bytes: the next pull starts over
        raise OSError(f"{label}: its sha256 is not the Hub's")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(CHUNK):
            h.update(piece)
    return h.hexdigest()


def _choose(name, repo, files):
    """The patterns of the files to fetch (of the repo's `files`): the container it holds."""
    if "model.bin" in files:
        need, wanted = ("config.json", "model.bin"), CT2_FILES
    elif "model.safetensors" in files:
        need, wanted = ("config.json", "model.safetensors", "tokenizer.json"), HF_FILES
    else:
        raise CheckpointError(name, f"{repo} holds no whole Whisper model in a container nwhisper "
                                    f"reads (model.bin with config.json, or model.safetensors); it "
                                    f"has: {', '.join(sorted(files)[:12]) or 'no files'}")
    missing = [f for f in need if f not in files]
    if missing or not any(_matches(f, ["tokenizer.json", "vocabulary.*"]) for f in files):
        raise CheckpointError(name, f"{repo} lacks {', '.join(missing) or 'a tokenizer.json or vocabulary'}")
    return wanted


def _matches(filename, patterns):
    return any(fnmatch.fnmatch(filename, p) for p in patterns)


def _line(e):
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
