"""`nwhisper serve`: a transcription service on Tornado — whisper.cpp's, OpenAI's and Deepgram's
HTTP APIs, and live audio over WebSockets (the seed protocol and OpenAI Realtime), on one port;
Home Assistant's Wyoming protocol on a socket of its own. The live dialects are adapters over nwhisper.stream.

The model loads once, before the port opens; a request pays only for its own audio.

    app.py              the routes, the small handlers; Config; run() loads, binds and serves
    handlers.py         the JSON handler every route derives from: CORS, the token, errors
    transcription.py    POST /inference and /v1/audio/transcriptions|translations
    upload.py           a request's audio and fields (multipart or raw body); Reject
    formats.py          json, text, srt, vtt, verbose_json
    model_host.py       ModelHost: the model, its one worker thread, finals before drafts, idle unload
    limits.py           Slots: how many requests are served at once, and a bounded wait
    stream.py           the live WebSocket at / and /stream; protocol.py, its frames
    realtime.py         OpenAI Realtime transcription sessions; realtime_events.py, their events
    wyoming.py          Wyoming speech-to-text (Home Assistant); wyoming_events.py, its frames
    deepgram.py         Deepgram's POST /v1/listen; deepgram_fields.py, its parameters and answers
    client.py           a client of the live stream (`nwhisper stream`)
    auth.py, tls.py     the token; a self-signed certificate or your PEMs
    static/             the test page served at /
"""

from .app import Config, make_app, run

__all__ = ["Config", "make_app", "run"]
