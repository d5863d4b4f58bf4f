"""A Hugging Face Hub of our own on loopback: the routes huggingface_hub calls to download a
model repo, served by Tornado in a thread, so that a pull is tested with the real client and
nothing leaves the machine (point HF_ENDPOINT at `hub.url`).

    hub = FakeHub({"Systran/faster-whisper-small": {"model.bin": "/path/model.bin", ...}})
    hub.throttle["model.bin"] = 4e6     # bytes a second for that file
    hub.stall["model.bin"] = 1 << 20    # send this much of it, then nothing
    hub.gone.add("model.bin")           # listed, but 404 when fetched
    hub.requests                        # [(method, path, Range header or None)]
    hub.stop()

Routes, as the Hub answers them: GET /api/models/OWNER/REPO[/revision/REV] (the repo's info, its
files as `siblings`), GET /api/models/OWNER/REPO/tree/REV[/PATH] (the file listing), HEAD and
GET /OWNER/REPO/resolve/REV/FILE (X-Repo-Commit, the ETag (an LFS file's sha256), byte ranges).
An unknown repo is 404 with X-Error-Code RepoNotFound, an unknown file EntryNotFound.
"""

import asyncio
import hashlib
import json
import os
import threading

import tornado.httpserver
import tornado.netutil
import tornado.web

CHUNK = 1 << 16


def _blob(path):
    with open(path, "rb") as f:
        data = f.read()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), "path": path}


class FakeHub:
    def __init__(self, repos):
        self.repos = {}
        for repo, files in repos.items():
            self.add(repo, files)
        self.throttle, self.stall, self.gone, self.requests = {}, {}, set(), []
        self._stalled = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def add(self, repo, files):
        blobs = {name: _blob(path) for name, path in files.items()}
        sha = hashlib.sha1(json.dumps({n: b["sha256"] for n, b in sorted(blobs.items())}).encode()).hexdigest()
        self.repos[repo] = {"sha": sha, "files": blobs}

    def _serve(self, started):
        asyncio.set_event_loop(asyncio.new_event_loop())
        self._stalled = asyncio.Event()
        app = tornado.web.Application([
            (r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", _Tree, {"hub": self}),
            (r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", _Info, {"hub": self}),
            (r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", _Resolve, {"hub": self}),
        ])
        self._server = tornado.httpserver.HTTPServer(app)
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self._server.add_sockets(sockets)
        self._loop = asyncio.get_event_loop()
        started.set()
        self._loop.run_forever()

    def stop(self):
        def halt():
            self._stalled.set()
            self._server.stop()
            self._loop.stop()
        self._loop.call_soon_threadsafe(halt)
        self._thread.join(10)


class _Handler(tornado.web.RequestHandler):
    def initialize(self, hub):
        self.hub = hub

    def prepare(self):
        self.hub.requests.append((self.request.method, self.request.path, self.request.headers.get("Range")))

    def repo(self, repo_id, revision):
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self.missing("RepoNotFound", f"Repository not found: {repo_id}")
        elif revision not in (None, "main", repo["sha"]):
            self.missing("RevisionNotFound", f"Invalid rev id: {revision}")
        return repo

    def missing(self, code, message):
        self.set_status(404)
        self.set_header("X-Error-Code", code)
        self.set_header("X-Error-Message", message)
        self.finish({"error": message})


class _Info(_Handler):
    def get(self, repo_id, revision):
        repo = self.repo(repo_id, revision)
        if repo is not None:
            self.finish({"id": repo_id, "modelId": repo_id, "sha": repo["sha"], "private": False,
                         "siblings": [{"rfilename": n, "size": b["size"], "blobId": b["oid"],
                                       "lfs": {"sha256": b["sha256"], "size": b["size"], "pointerSize": 134}}
                                      for n, b in repo["files"].items()]})


class _Tree(_Handler):
    def get(self, repo_id, revision, path):
        repo = self.repo(repo_id, revision)
        if repo is not None:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps([{"type": "file", "path": n, "size": b["size"], "oid": b["oid"],
                                     "lfs": {"oid": b["sha256"], "size": b["size"], "pointerSize": 134}}
                                    for n, b in repo["files"].items()]))


class _Resolve(_Handler):
    def head(self, repo_id, revision, name):
        self.headers_for(repo_id, revision, name) and self.finish()

    def headers_for(self, repo_id, revision, name):
        repo = self.repo(repo_id, revision)
        if repo is None:
            return None
        blob = None if name in self.hub.gone else repo["files"].get(name)
        if blob is None:
            self.missing("EntryNotFound", f"{name} does not exist on main")
            return None
        self.set_header("X-Repo-Commit", repo["sha"])
        self.set_header("ETag", f'"{blob["sha256"]}"')
        self.set_header("Accept-Ranges", "bytes")
        self.set_header("Content-Length", str(blob["size"]))
        return blob

    async def get(self, repo_id, revision, name):
        blob = self.headers_for(repo_id, revision, name)
        if blob is None:
            return
        start, size = 0, blob["size"]
        if self.request.headers.get("Range", "").startswith("bytes="):
            start = int(self.request.headers["Range"][6:].split("-")[0])
            self.set_status(206)
            self.set_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.set_header("Content-Length", str(size - start))
        rate, stall = self.hub.throttle.get(name), self.hub.stall.get(name)
        with open(blob["path"], "rb") as f:
            f.seek(start)
            sent = start
            while piece := f.read(CHUNK):
                if stall is not None and sent + len(piece) > stall:
                    self.write(piece[:max(0, stall - sent)])
                    await self.flush()
                    await self.hub._stalled.wait()        # hold the connection open, say nothing
                    return
                self.write(piece)
                await self.flush()
                sent += len(piece)
                if rate:
                    await asyncio.sleep(len(piece) / rate)
        self.finish()
