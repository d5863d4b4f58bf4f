"""Audio inside the containers libsndfile does not read — m4a/AAC voice memos, mp4/mov/mkv video,
webm/opus from browsers' MediaRecorder, wma, amr … — decoded by FFmpeg's libraries through PyAV.

    rate, blocks = decode("memo.m4a", "memo.m4a")     # blocks: mono float32 pieces at `rate`

The first audio stream is decoded packet by packet; each frame is converted to planar float32
at its own rate and layout (FFmpeg changes nothing else) and its channels are averaged here, as
load_audio does for every other format, so the resampling to 16 kHz is nwhisper's own. Anything
FFmpeg cannot make sense of — no audio stream, a truncated or hostile container, a codec it does
not have — raises AudioError with FFmpeg's reason on one line. A damaged packet is skipped, as
FFmpeg's own players do; a file that decodes to clearly less audio than its header declares (a
cut-off upload or copy) is refused, as a truncated WAV is.
"""

from __future__ import annotations

import numpy as np

from .errors import AudioError


def decode(name, source, block=1 << 20, tried=None, mix=True):
    """(sample rate, iterator of mono float32 blocks of about `block` samples, the sample count
    the container declares or 0) of `source`'s first audio stream; `source` is a path or a
    seekable binary file object. `tried`: why another
    decoder refused it, said beside FFmpeg's reason when FFmpeg refuses it too. mix=False:
    blocks of (frames, channels), the channels kept apart."""
    import av

    try:
        container = av.open(source, mode="r", metadata_errors="ignore")
    except (av.FFmpegError, ValueError, OSError, UnicodeDecodeError) as e:
        why = f"FFmpeg: {_reason(e)}" if tried is None else f"{tried}; FFmpeg: {_reason(e)}"
        raise AudioError(name, f"cannot decode audio: {why}") from None
    try:
        if not container.streams.audio:
            kinds = ", ".join(sorted({s.type for s in container.streams})) or "nothing"
            raise AudioError(name, f"holds no audio stream (it holds {kinds})")
        stream = container.streams.audio[0]
        if stream.codec_context is None:
            raise AudioError(name, "its audio stream's codec has no decoder in this FFmpeg build")
        rate = stream.codec_context.sample_rate or stream.rate
        if not rate:
            raise AudioError(name, "its audio stream declares no sample rate")
    except BaseException:
        container.close()
        raise
    declared = _declared_s(container, stream)
    return rate, _blocks(name, container, stream, rate, block, mix), int(declared * rate) if declared else 0


def _blocks(name, container, stream, rate, block, mix):
    import av

    resampler = av.AudioResampler(format="fltp", rate=rate)     # keeps the layout
    pending, n, total = [], 0, 0
    try:
        for packet in container.demux(stream):
            for frame in _frames(name, packet):
                for converted in resampler.resample(frame):
                    x = _mono(converted) if mix else _apart(converted)
                    pending.append(x)
                    n += len(x)
                    total += len(x)
            if n >= block:
                yield np.concatenate(pending)
                pending, n = [], 0
        for converted in resampler.resample(None):        # what the resampler still holds
            pending.append(_mono(converted) if mix else _apart(converted))
            total += len(pending[-1])
        declared = _declared_s(container, stream)
        if declared is not None and total / rate < declared - max(TRUNCATED_S, 0.05 * declared):
            raise AudioError(name, f"truncated: its header declares {declared:.2f} s of audio but "
                                   f"only {total / rate:.2f} s decode")
        if pending:
            yield np.concatenate(pending)
    except av.FFmpegError as e:
        raise AudioError(name, f"cannot decode audio: {_reason(e)}") from None
    finally:
        container.close()


def _mono(frame):
    """A planar float32 frame's channels averaged (as load_audio does for every format)."""
    x = frame.to_ndarray()
    return np.ascontiguousarray(x[0] if len(x) == 1 else x.mean(axis=0, dtype=np.float32), np.float32)


def _apart(frame):
    """A planar float32 frame as (frames, channels)."""
    return np.ascontiguousarray(frame.to_ndarray().T, np.float32)


TRUNCATED_S = 0.5           # decoders' priming and padding move a length by far less than this


def _declared_s(container, stream):
    """The audio stream's length as the container declares it, in seconds (None: not said)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and len(container.streams) == 1:   # WebM says it here
        return container.duration / 1e6
    return None


def _frames(name, packet):
    import av

    try:
        return packet.decode()
    except av.error.InvalidDataError:
        return ()              # one damaged packet: FFmpeg's players skip it, and so do we


def _reason(e):
    text = getattr(e, "strerror", None) or str(e)
    return " ".join(str(text).split()) or type(e).__name__
