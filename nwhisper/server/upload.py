"""What a transcription request carries: the audio bytes, their name, the form fields.

    up = parse(request, body)        # Upload(data, filename, fields); Reject on a bad request
    up.text("language"), up.flag("vad"), up.number("temperature", 0, 1)

Two shapes are accepted, as whisper.cpp's server and OpenAI's API send them:

* multipart/form-data with the audio in the `file` part and options as the other parts;
* anything else: the whole body is the audio (`curl --data-binary @clip.wav`), options in the
  query string (`?response_format=text&language=fi`).

Query-string fields also apply to multipart requests, under the form's own. Booleans read as
whisper.cpp reads them (true/1/yes/y; false/0/no/n), but anything else is an error here rather
than a silent false. A WAV cut off in transit is refused when it is decoded
(io/audio.py's check_wav_length).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tornado import httputil


class Reject(Exception):
    """A request the server answers with `status` and an error naming the problem; `param`: the
    request field at fault, where there is one (OpenAI's error object names it)."""

    def __init__(self, status, message, param=None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


TRUE, FALSE = ("true", "1", "yes", "y", "on"), ("false", "0", "no", "n", "off", "")


@dataclass
class Upload:
    data: bytes
    filename: str
    fields: dict = field(default_factory=dict)      # name → [str, …], last one wins

    def has(self, name):
        return name in self.fields

    def text(self, name, default=None):
        values = self.fields.get(name)
        return values[-1].strip() if values else default

    def texts(self, name):
        return [v.strip() for v in self.fields.get(name, [])]

    def flag(self, name, default=None):
        v = self.text(name)
        if v is None:
            return default
        if v.lower() in TRUE:
            return True
        if v.lower() in FALSE:
            return False
        raise Reject(400, f"field '{name}' must be true or false, not {v!r}", name)

    def number(self, name, lo, hi, default=None):
        v = self.text(name)
        if v is None or v == "":
            return default
        try:
            x = float(v)
        except ValueError:
            raise Reject(400, f"field '{name}' must be a number, not {v!r}", name) from None
        if not lo <= x <= hi:
            raise Reject(400, f"field '{name}' must be between {lo} and {hi}, not {v}", name)
        return x


def parse(request, body):
    """Upload from a tornado request whose body was read as `body` (bytes)."""
    fields = {k: [v.decode("utf-8", "replace") for v in vs]
              for k, vs in request.query_arguments.items() if k != "token"}
    ctype = request.headers.get("Content-Type", "")
    if ctype.lower().startswith("multipart/form-data"):
        args, files = {}, {}
        try:
            httputil.parse_body_arguments(ctype, body, args, files, request.headers)
        except httputil.HTTPInputError as e:
            raise Reject(400, f"broken multipart/form-data body: {_strip_prefix(str(e))}") from None
        for k, vs in args.items():
            fields[k] = [v.decode("utf-8", "replace") for v in vs]
        if "file" not in files:
            if "file" in args:     # sent as a plain field (no filename): still the audio
                data, name = args["file"][-1], "file"
            else:
                raise Reject(400, "no 'file' field in the request: send the audio as the multipart "
                                  "field 'file'", "file")
        else:
            data, name = files["file"][-1].body, files["file"][-1].filename or "file"
    else:
        data, name = body, "request body"
    if not data:
        raise Reject(400, f"empty audio: {name} has 0 bytes (send a WAV or another audio file "
                          f"as the multipart field 'file' or as the whole request body)", "file")
    return Upload(bytes(data), name, fields)


def _strip_prefix(message):
    for p in ("Invalid multipart/form-data: ",):
        while message.startswith(p):
            message = message[len(p):]
    return message
