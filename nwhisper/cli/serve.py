"""`nwhisper serve [MODEL] --addr HOST:PORT …` — the model as a service (nwhisper/server)."""

from __future__ import annotations

import importlib.util
import sys

import click

from ..io.registry import DEFAULT_MODEL
from .options import compute_type_option, max_tokens_option, offline_option


def parse_addr(addr):
    """'HOST:PORT', '[v6]:PORT', ':PORT' (every address) or 'PORT' (loopback) → (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", addr
    elif host == "":
        host = "0.0.0.0"
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{addr!r}: expected HOST:PORT with PORT in 0–65535 "
                                 f"(0 picks a free one)", param_hint="--addr")
    return host, int(port)


@click.argument("model", required=False, default=None)
@click.option("--model", "more_models", multiple=True, metavar="NAME",
              help="another model to hold (repeatable); requests choose by name, MODEL (or the first) is the default")
@click.option("--addr", default="127.0.0.1:6543", show_default=True,
              help="HOST:PORT to listen on (0.0.0.0:PORT for the LAN; port 0 picks a free one)")
@click.option("--lang", default=None, help="default language of requests that name none (default: detect; English on .en models)")
@click.option("--vad", is_flag=True, help="skip non-speech (Silero VAD) by default (a request's vad field overrides)")
@click.option("--timestamps", is_flag=True, help="timestamped segments by default (a request's timestamps field overrides; srt, vtt and verbose_json always have them)")
@max_tokens_option
@click.option("--tail-ms", type=click.IntRange(32, 2000), default=None, metavar="MS",
              help="audio after the voice that each live utterance keeps, fixed (in 32 ms steps)  "
                   "[default: 200, shortened while the model is too slow to answer at the pause]")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@compute_type_option
@click.option("--tls", is_flag=True, help="https/wss with a self-signed ECDSA P-256 certificate (minted once, kept in --tls-dir)")
@click.option("--cert", type=click.Path(exists=True, dir_okay=False), help="certificate PEM (with --key): https with your own certificate")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), help="private key PEM for --cert")
@click.option("--tls-dir", default=None, help="where --tls keeps its certificate  [default: ~/.cache/nwhisper/tls]")
@click.option("--token", envvar="NWHISPER_TOKEN", default=None, show_envvar=True,
              help="require 'Authorization: Bearer TOKEN' or '?token=TOKEN' (all but / and /health); prefer the environment variable, a flag shows in ps")
@click.option("--unload-after", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
              help="release the model after this many idle seconds; the next request reloads it (0: never)")
@click.option("--connections", type=click.IntRange(1, 256), default=8, show_default=True,
              help="requests and streams served at once")
@click.option("--queue", type=click.IntRange(0, 4096), default=16, show_default=True,
              help="requests waiting for a free connection before the server answers 503")
@click.option("--max-upload-mb", type=click.FloatRange(min=0.001), default=100, show_default=True,
              help="largest request body accepted (413 above)")
@click.option("--wyoming", metavar="URI", default=None,
              help="also serve Home Assistant's Wyoming protocol on tcp://HOST:PORT (e.g. tcp://0.0.0.0:10300) or unix://PATH")
@click.option("--wyoming-own-vad", is_flag=True,
              help="tell Wyoming clients they need no VAD of their own (our endpointer ends each command)")
@click.option("--zeroconf", is_flag=False, flag_value="nwhisper", default=None, metavar="[NAME]",
              help="advertise the Wyoming service on the LAN (mDNS _wyoming._tcp, as Home Assistant discovers it)")
@click.option("--no-http", is_flag=True, help="serve only --wyoming (no HTTP port)")
@offline_option
def serve(model, more_models, addr, lang, vad, timestamps, max_tokens, tail_ms, device, compute_type, tls, cert, key, tls_dir, token,
          unload_after, connections, queue, max_upload_mb, wyoming, wyoming_own_vad, zeroconf, no_http, offline):
    """Serve MODEL (a name or path; default tiny.en), and any --model, over HTTP: whisper.cpp's POST /inference,
    OpenAI's POST /v1/audio/transcriptions and /translations, GET /health, and a test page at /;
    with --wyoming, to Home Assistant's voice devices. The model loads before the port opens."""
    from ..io.checkpoint import CheckpointError
    from ..server import tls as T
    from ..server.app import Config, run

    host, port = parse_addr(addr)
    if bool(cert) != bool(key):
        raise click.UsageError("--cert and --key go together")
    if no_http and not wyoming:
        raise click.UsageError("--no-http serves nothing without --wyoming URI")
    if (zeroconf or wyoming_own_vad) and not wyoming:
        raise click.UsageError("--zeroconf and --wyoming-own-vad go with --wyoming URI")
    if wyoming:
        from ..server.wyoming import parse_uri
        try:
            kind, _, _ = parse_uri(wyoming)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--wyoming") from None
        if zeroconf and kind != "tcp":
            raise click.UsageError("--zeroconf advertises a tcp:// address, not a unix socket")
        if zeroconf and importlib.util.find_spec("zeroconf") is None:
            raise click.UsageError("--zeroconf needs the zeroconf package: pip install 'nwhisper[wyoming]'")
    ssl_ctx = None
    try:
        if cert:
            ssl_ctx = T.context(cert, key)
            click.echo(f"nwhisper: TLS with {cert} ({T.fingerprint(cert)})")
        elif tls:
            directory = tls_dir or T.default_dir()
            cert, key, minted = T.self_signed(directory, T.names_for(host))
            ssl_ctx = T.context(cert, key)
            click.echo(f"nwhisper: self-signed TLS {'minted' if minted else 'reused'}: {cert} "
                       f"({T.fingerprint(cert)}) — the browser will warn once; accept it and the "
                       f"microphone works")
        models = tuple(dict.fromkeys(([model] if model else []) + list(more_models))) or (DEFAULT_MODEL,)
        cfg = Config(models=models, device=device, compute_type=compute_type, host=host, port=port,
                     language=lang.strip().lower() if lang else None, vad=vad,
                     timestamps=timestamps, max_tokens=max_tokens, tail_ms=tail_ms, token=token or None,
                     ssl=ssl_ctx, unload_after=unload_after, connections=connections, queue=queue,
                     max_upload=int(max_upload_mb * (1 << 20)), http=not no_http, wyoming=wyoming,
                     wyoming_own_vad=wyoming_own_vad, zeroconf=zeroconf, offline=offline)
        _logging()
        run(cfg)
    except (CheckpointError, ValueError, RuntimeError, OSError) as e:
        click.echo(f"nwhisper: {e}", err=True)
        sys.exit(2)


def _logging():
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        datefmt="%H:%M:%S")


command = click.command("serve", context_settings={"help_option_names": ["-h", "--help"]})(serve)
