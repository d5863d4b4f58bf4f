"""The JSON request handler every HTTP route derives from: whisper.cpp's CORS headers, OPTIONS
preflight, the token check, and errors as one JSON sentence — on the /v1/ routes OpenAI's error
object, which its clients show."""

from __future__ import annotations

import json

from tornado import web

from . import auth

OPENAI_CODES = {401: "invalid_api_key", 404: "unknown_url", 413: "file_too_large", 503: "server_busy"}


class JsonHandler(web.RequestHandler):
    """CORS headers as whisper.cpp sends them, OPTIONS preflight, errors as JSON sentences."""

    def initialize(self, ctx):
        self.ctx = ctx

    def set_default_headers(self):
        self.set_header("Server", "nwhisper")
        self.set_header("Access-Control-Allow-Origin", "*")
        self.set_header("Access-Control-Allow-Headers", "content-type, authorization")
        self.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")

    def options(self, *args):
        self.set_status(204)

    def fail(self, status, message, param=None):
        """Answer with an error: whisper.cpp's {"error": message}, or on the /v1/ routes
        OpenAI's error object, which its clients show ({"error": {"message", "type", "param",
        "code"}})."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        if self.request.path.startswith("/v1/"):
            body = {"error": {"message": message,
                              "type": "server_error" if status >= 500 else "invalid_request_error",
                              "param": param, "code": OPENAI_CODES.get(status)}}
        else:
            body = {"error": message}
        self.finish(json.dumps(body, ensure_ascii=False))

    def write_error(self, status, **kwargs):
        e = kwargs.get("exc_info", (None, None))[1]
        if status == 405:
            message = f"{self.request.method} is not allowed on {self.request.path}"
        elif status == 404:
            message = (f"no such route: {self.request.method} {self.request.path} (try GET /, "
                       f"GET /health, POST /inference, POST /v1/audio/transcriptions)")
        elif isinstance(e, web.HTTPError) and e.log_message:
            message = e.log_message
        else:
            message = self._reason
        self.clear_header("Content-Type")
        self.fail(status, message)

    def authorized(self):
        why = auth.problem(self.request, self.ctx.config.token)
        if why:
            self.set_header("WWW-Authenticate", 'Bearer realm="nwhisper"')
            self.fail(401, why)
        return why is None


class NotFound(JsonHandler):
    def prepare(self):
        raise web.HTTPError(404)


class UnknownModel(ValueError):
    """A request named a model this server does not hold (Context.choose)."""

    def __init__(self, name, served):
        super().__init__(f"model {name!r} is not served here; this server holds: {', '.join(served)}")
