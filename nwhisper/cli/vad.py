"""`nwhisper vad AUDIO`: what the live endpointer would have done with a recording.

The file is fed to the same detector + endpointer a WebSocket stream uses (nwhisper.vad), chunk by
chunk, and the utterances are printed on the stream's clock: t0..t1 is the audio that would be
transcribed, speech t0..t1 where the voice itself began and ended, and "closed" when the
endpointer knew (the voice's end + the closing pause). No model is needed.
"""

import json
import sys

import click


def _t(s):
    m, s = divmod(s, 60)
    return f"{int(m):02d}:{s:06.3f}"


def vad(audio, partials, pause, legacy, energy, near_db, threshold, max_utt_ms, partial_ms,
        levels, as_json):
    """Print the utterances (and partial points) the live endpointer cuts AUDIO into."""
    from ..io.audio import AudioError, load_audio
    from ..vad import EndpointerOptions, message, run
    from ..vad.silero import weights_available

    kw = dict(partials=partials, partial_ms=partial_ms, threshold=threshold,
              max_utt_ms=max_utt_ms, level_ms=1000 if levels else 0)
    try:
        if legacy:
            opts = EndpointerOptions.legacy_options(pause_ms=pause, **kw)
        else:
            opts = EndpointerOptions(pause_ms=pause, near_db=near_db, **kw)
        x = load_audio(audio)
    except (AudioError, ValueError, OSError) as e:
        click.echo(f"nwhisper vad: {e}", err=True)
        sys.exit(2)
    kind = "energy" if energy or not weights_available() else "silero"
    events = run(x, opts, vad=kind)
    if as_json:
        for e in events:
            click.echo(json.dumps(message(e)))
        return
    mode = "legacy" if legacy else ("pause %d ms" % pause if pause else "learned pause")
    click.echo(f"# {audio}: {len(x) / 16000:.2f} s, vad {kind}, {mode}, near_db "
               f"{0 if legacy else near_db:g}")
    for e in events:
        if e.kind == "start" and partials:
            click.echo(f"     start  {_t(e.speech_t0)}  (known at {_t(e.at)})")
        elif e.kind == "partial":
            click.echo(f"   partial  {_t(e.t0)} --> {_t(e.t1)}")
        elif e.kind == "level":
            snr = "-" if e.snr_db is None else f"{e.snr_db:.1f}"
            click.echo(f"     level  {_t(e.at)}  noise {e.noise_db:.1f} dB  speech "
                       f"{'-' if e.speech_db is None else f'{e.speech_db:.1f}'} dB  snr {snr}  "
                       f"p_noise {e.p_noise:.2f}  threshold {e.threshold:.2f}  pause "
                       f"{e.pause_ms} ms")
        elif e.kind == "drop":
            why = ("a nearer voice came" if e.why == "nearer"
                   else "its voice never reached the speaker's level")
            click.echo(f"      drop  utterance {e.seg} at {_t(e.at)}: {why}; it was someone else's")
        elif e.kind == "end":
            click.echo(f"[{_t(e.t0)} --> {_t(e.t1)}]  speech {_t(e.speech_t0)} --> "
                       f"{_t(e.speech_t1)}  closed {_t(e.at)} ({e.reason})")


command = click.command("vad")(
    click.argument("audio", type=click.Path(exists=True, dir_okay=False))(
    click.option("--partials", is_flag=True, help="also print the partial points (drafts)")(
    click.option("--pause", type=click.IntRange(1, 10000), default=None, metavar="MS",
                 help="a fixed closing pause in ms  [default: learned, 300..1000 from 400]")(
    click.option("--legacy", is_flag=True,
                 help="the old endpointer: fixed threshold and pause (800 ms), no room, no gate")(
    click.option("--energy", is_flag=True, help="the energy detector instead of Silero")(
    click.option("--near-db", type=float, default=10.0, show_default=True,
                 help="a voice this far below the speaker's is someone else; 0 = off")(
    click.option("--threshold", type=float, default=0.5, show_default=True,
                 help="p(speech) that opens an utterance (the room may raise it)")(
    click.option("--max-utt-ms", type=click.IntRange(1, 28000), default=28000,
                 show_default=True, help="close at the best gap past this")(
    click.option("--partial-ms", type=click.IntRange(32, 60000), default=300, show_default=True,
                 help="a partial point per this much new speech")(
    click.option("--levels", is_flag=True, help="print the room's levels once a second")(
    click.option("--json", "as_json", is_flag=True, help="one JSON event per line")(
        vad))))))))))))
