"""`nwhisper stream URL AUDIO`: send a recording to a server's live WebSocket as a microphone
would (real time by default), and print what comes back as it comes."""

from __future__ import annotations

import json
import sys

import click


def stream(url, audio, pace, partials, pause, lang, token, as_json):
    """Stream AUDIO to the live WebSocket at URL (ws://HOST:PORT/stream or wss://…) and print
    its finals (and drafts with --partials) as they arrive."""
    import asyncio   # here, not at the top: every other command would pay for its import

    from ..io.audio import AudioError, load_audio
    from ..server.client import stream as run

    try:
        x = load_audio(audio)
    except (AudioError, OSError) as e:
        click.echo(f"nwhisper stream: {e}", err=True)
        sys.exit(2)
    config = {"partials": partials}
    if pause:
        config["pause_ms"] = pause
    if lang:
        config["lang"] = lang

    def show(r):
        m = r.msg
        if as_json:
            click.echo(json.dumps({"at": r.at, **m}, ensure_ascii=False))
        elif "error" in m:
            click.echo(f"{r.at:7.2f}  error: {m['error']}", err=True)
        elif m.get("type") == "final" and m["text"].strip():
            click.echo(f"{r.at:7.2f}  [{m['speech_t0']:.2f} --> {m['speech_t1']:.2f}] {m['text'].strip()}"
                       f"  ({m['proc_ms']} ms after the pause)")
        elif m.get("type") == "partial":
            click.echo(f"{r.at:7.2f}  … {m['text'].strip()}")

    from tornado.httpclient import HTTPClientError

    try:
        result = asyncio.run(run(url, x, config=config, pace=pace, token=token, on_message=show))
    except HTTPClientError as e:        # the handshake was refused: the server says why
        body = e.response.body.decode("utf-8", "replace") if e.response is not None else ""
        click.echo(f"nwhisper stream: {url}: {e.code} {body}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"nwhisper stream: cannot reach {url}: {e}", err=True)
        sys.exit(2)
    if result.closed and result.closed[0] not in (None, 1000):
        click.echo(f"nwhisper stream: the server closed the stream: {result.closed}", err=True)
        sys.exit(1)


command = click.command("stream", context_settings={"help_option_names": ["-h", "--help"]})(
    click.argument("url")(
    click.argument("audio", type=click.Path(exists=True, dir_okay=False))(
    click.option("--pace", type=click.FloatRange(min=0), default=1.0, show_default=True,
                 help="1 = real time, 2 = twice as fast, 0 = as fast as the socket takes it")(
    click.option("--partials", is_flag=True, help="ask for drafts while each utterance is spoken")(
    click.option("--pause", type=click.IntRange(1, 10000), default=None, metavar="MS",
                 help="a fixed closing pause  [default: the server's learned one]")(
    click.option("--lang", default=None, help="the language (default: the server's)")(
    click.option("--token", envvar="NWHISPER_TOKEN", default=None, show_envvar=True,
                 help="the server's token (sent as Authorization: Bearer)")(
    click.option("--json", "as_json", is_flag=True, help="every message as a JSON line")(
        stream)))))))))
