"""The `nwhisper` command: one click group, one subcommand per job.

Each subcommand parses its options, calls the library, and prints; no model math lives here.
"""

from __future__ import annotations

import sys

import click

from ..io.checkpoint import CheckpointError
from ..io.registry import DEFAULT_MODEL


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nwhisper")
def cli():
    """Whisper speech recognition on single-source Numba kernels (CPU and CUDA)."""


def _fail(e):
    click.echo(f"nwhisper: {e}", err=True)
    sys.exit(2)


@cli.command()
def models():
    """List the installable model names and where each is installed."""
    from ..io.registry import installed

    for name, src, packages in installed():
        mark = " (default)" if name == DEFAULT_MODEL else ""
        if src is None:
            click.echo(f"{name:8s} not installed{mark}: pip install {packages}")
        else:
            click.echo(f"{name:8s} {src.container} {src.describe()}{mark}")


@cli.command()
@click.argument("src")
@click.argument("dst")
@click.option("--to", "fmt", type=click.Choice(["hf", "ggml"]), required=True,
              help="hf: a Hugging Face directory; ggml: a whisper.cpp .bin file")
def convert(src, dst, fmt):
    """Write model SRC (a name or path) as DST in another container."""
    from ..io.convert import convert as run

    try:
        out = run(src, dst, to=fmt)
    except (CheckpointError, OSError) as e:
        _fail(e)
    click.echo(out)


def _fmt_time(t):
    m, s = divmod(t, 60)
    return f"{int(m):02d}:{s:05.2f}"


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="[MODEL] AUDIO...")
@click.option("--lang", default=None, help="language code (en, fi, sv …); default: detect (English on .en models)")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True)
@click.option("--max", "max_tokens", type=click.IntRange(1, 448), default=224, show_default=True,
              help="stop after N tokens per 30 s window")
@click.option("--timestamps", is_flag=True, help="print [mm:ss.xx --> mm:ss.xx] segments")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
def transcribe(args, lang, task, max_tokens, timestamps, device):
    """Transcribe AUDIO files with MODEL (a name or path; default tiny.en)."""
    from ..api import load
    from ..io.audio import AudioError
    from ..io.registry import KNOWN

    model_arg, files = _split_model(args, KNOWN)
    try:
        model = load(model_arg, device=device)
        for f in files:
            segments, _ = model.transcribe(f, language=lang, task=task, max_tokens=max_tokens, timestamps=timestamps)
            if len(files) > 1:
                click.echo(f"# {f}")
            if timestamps:
                for s in segments:
                    click.echo(f"[{_fmt_time(s.start)} --> {_fmt_time(s.end)}] {s.text.strip()}")
            else:
                click.echo("".join(s.text for s in segments).strip())
    except (CheckpointError, AudioError, ValueError, RuntimeError) as e:
        _fail(e)


def _split_model(args, known):
    """[MODEL] AUDIO...: the first argument is the model when it is a model name, a model
    directory, or a ggml file — and there is audio after it."""
    import os

    first = args[0]
    if len(args) > 1 and (first in known or os.path.isdir(first) or _is_ggml(first)):
        return first, list(args[1:])
    return None, list(args)


def _is_ggml(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"lmgg"
    except OSError:
        return False


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="MODEL|config.json [model.safetensors] AUDIO")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="where to write the states")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
def encode(args, output, device):
    """Write the encoder's n_audio_ctx × d_model states of AUDIO's first 30 s, row-major float32."""
    import os

    from ..api import load
    from ..io.audio import AudioError

    if len(args) == 3:          # config.json model.safetensors clip.wav: a Hugging Face directory
        cfg, weights, audio = args
        if os.path.dirname(os.path.abspath(cfg)) != os.path.dirname(os.path.abspath(weights)):
            _fail("config.json and model.safetensors must be in the same directory")
        model_arg = os.path.dirname(os.path.abspath(weights))
    elif len(args) == 2:
        model_arg, audio = args
        if os.path.basename(model_arg) == "config.json":
            model_arg = os.path.dirname(os.path.abspath(model_arg))
    else:
        _fail("usage: nwhisper encode MODEL|config.json [model.safetensors] AUDIO -o OUT")
    try:
        states = load(model_arg, device=device).encode(audio)
    except (CheckpointError, AudioError, ValueError, RuntimeError) as e:
        _fail(e)
    states.astype("<f4").tofile(output)
    click.echo(f"{output}: {states.shape[0]} x {states.shape[1]} float32")


def _register():
    """Commands that live in their own modules (each defines `command`)."""
    from . import serve, vad

    for mod in (serve, vad):
        cli.add_command(mod.command)


_register()


def main():
    cli()
