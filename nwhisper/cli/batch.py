"""`nwhisper batch INPUTS... -o OUTDIR`: every recording in files, folders and manifests
transcribed into OUTDIR, resumable, on N local workers or a Ray cluster (nwhisper.batch)."""

import sys

import click

from ..io.registry import DEFAULT_MODEL
from .options import batch_size_option, compute_type_option, diarize_options, hotwords_option, offline_option


def _formats(value, diarize):
    from ..writers import ALL, FORMATS

    every = ALL + (("rttm",) if diarize else ())
    fmts = every if value == "all" else tuple(f.strip() for f in value.split(",") if f.strip())
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise click.BadParameter(f"{value!r}: the formats are {', '.join(FORMATS)} (comma-separated) or 'all'")
    return tuple(dict.fromkeys(fmts))


@click.command("batch", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("inputs", nargs=-1, required=True, metavar="INPUTS...")
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False),
              help="where the outputs go, laid out as the inputs are")
@click.option("-f", "--format", "fmt", default="txt,json", show_default=True,
              help="comma-separated: txt, srt, vtt, tsv, json, or all")
@click.option("-m", "--model", default=DEFAULT_MODEL, show_default=True, help="a model name or path")
@click.option("--workers", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="models loaded at once, each transcribing one recording at a time")
@click.option("--ray", default=None, metavar="auto|local|ADDRESS",
              help="run on Ray: local starts one on this machine, auto joins RAY_ADDRESS's cluster")
@click.option("--lang", default=None, help="language code for every recording (a manifest may give one per file)")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True)
@click.option("--vad", type=click.Choice(["silero", "energy"]), default=None,
              help="transcribe only the speech (as `nwhisper transcribe --vad`)")
@click.option("--word-timestamps", is_flag=True, help="word times in the json output")
@click.option("--beam", type=click.IntRange(1, 16), default=1, show_default=True)
@batch_size_option
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@compute_type_option
@click.option("--no-progress", is_flag=True, help="no progress bar")
@hotwords_option
@diarize_options
@offline_option
def command(inputs, output_dir, fmt, model, workers, ray, lang, task, vad, word_timestamps, beam,
            batch_size, device, compute_type, no_progress, hotwords, diarize, num_speakers, min_speakers,
            max_speakers, offline):
    """Transcribe every recording in INPUTS (files, folders, manifests) into OUTDIR."""
    from ..abilities import options as transcribe_options
    from ..batch.jobs import BatchError, collect
    from ..batch.pool import threads_each
    from ..batch.run import run
    from ..batch.work import WorkerSpec, cores
    from ..io.checkpoint import CheckpointError
    from ..io.hub import locate

    fmts = _formats(fmt, diarize)
    try:
        jobs = collect(inputs)
    except (BatchError, OSError) as e:
        click.echo(f"nwhisper batch: {e}", err=True)
        sys.exit(2)
    if not jobs:
        click.echo("nwhisper batch: no recordings found in the inputs", err=True)
        sys.exit(2)
    try:        # a conflict is named once, before any model loads
        options = transcribe_options(vad, formats=fmts, language=lang, task=task, beam_size=beam,
                                     timestamps=word_timestamps or None, word_timestamps=word_timestamps,
                                     batch_size=batch_size, hotwords=hotwords, diarize=diarize or None,
                                     num_speakers=num_speakers, min_speakers=min_speakers,
                                     max_speakers=max_speakers)
    except ValueError as e:
        click.echo(f"nwhisper batch: {e}", err=True)
        sys.exit(2)
    try:        # a model to download comes once, here, not once per worker
        locate(model, offline)
    except CheckpointError as e:
        click.echo(f"nwhisper batch: {e}", err=True)
        sys.exit(2)
    spec = WorkerSpec(model=model, outdir=output_dir, fmts=fmts, device=device,
                      compute_type=compute_type, threads=threads_each(workers, cores()),
                      options=options, vad=vad, offline=offline)
    try:
        summary = run(jobs, spec, workers=workers, ray=ray, progress=not no_progress)
    except (RuntimeError, ValueError, OSError) as e:     # the model or Ray could not start
        click.echo(f"nwhisper batch: {e}", err=True)
        sys.exit(2)
    click.echo(f"nwhisper batch: {summary.line()}", err=True)
    if summary.failed:
        click.echo(f"nwhisper batch: the failures and why: {output_dir}/failures.jsonl", err=True)
        sys.exit(1)
