"""`nwhisper serve`: a transcription service on Tornado — whisper.cpp's and OpenAI's HTTP APIs.

The model loads once, before the port opens; a request pays only for its own audio.

    app.py        routes and handlers; Config; run() loads, binds and serves
    inference.py  ModelHost: the model, its single worker thread, the job queue, idle unload
    limits.py     Slots: how many requests are served at once, and a bounded wait
    upload.py     a request's audio and fields (multipart or raw body); Reject
    formats.py    json, text, srt, vtt, verbose_json
    auth.py       the token (Bearer or ?token=), compared in constant time
    tls.py        a self-signed ECDSA P-256 certificate, or your PEMs
    static/       the test page served at /
    stream.py     (its own issue) the WebSocket for live audio, on the same port — see
                  app._stream_routes for what it plugs into

Run it as `nwhisper serve [MODEL] --addr HOST:PORT` or `python -m nwhisper.server …`.
"""

from .app import Config, make_app, run

__all__ = ["Config", "make_app", "run"]
