"""nwhisper.io.audio: decoding, downmix, resampling and bad input.

Truth comes from outside the module: scipy.signal.resample_poly is the resampling oracle
(correlation ≥ 0.9999 on real speech, SPEC §7), pure tones measure the alias rejection, and the
format tests write one source clip (fixtures/jfk.wav, real speech) with soundfile in every
format and check that all of them decode to the same 16 kHz signal. Clips and their credits:
fixtures/CREDITS.md.
"""

import io
import os
import struct
from math import gcd
from pathlib import Path

import numpy as np
import paths
import pytest
import scipy.signal
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nwhisper.io import audio
from nwhisper.io.audio import AudioError, load_audio, load_channels, pcm16_to_float32, resample

FIXTURES = Path(paths.FIXTURES)


def jfk():
    x, sr = sf.read(FIXTURES / "jfk.wav", dtype="float64")
    assert sr == 16000
    return x


def oracle(x, sr_in, sr_out=16000):
    g = gcd(sr_in, sr_out)
    return scipy.signal.resample_poly(np.asarray(x, np.float64), sr_out // g, sr_in // g)


def correlation(a, b):
    n = min(len(a), len(b))
    return np.corrcoef(a[:n], b[:n])[0, 1]


def tone(freq, sr, seconds=1.0):
    t = np.arange(int(sr * seconds)) / sr
    return np.sin(2 * np.pi * freq * t).astype(np.float32)


def rms_db(y, ref):
    """Level of y relative to ref in dB, leaving out the filter's start-up at both ends."""
    inner = slice(len(y) // 10, -len(y) // 10)
    return 20 * np.log10(np.sqrt(np.mean(y[inner] ** 2)) / np.sqrt(np.mean(ref[inner] ** 2)))


# --- resampling -------------------------------------------------------------------------------

REAL_SPEECH_AT_RATE = {
    8000: "leak-test.wav",                 # recorded at 8 kHz
    11025: "chan3.wav",                    # recorded at 11.025 kHz
    22050: "fillets/nl-vit-v-automat.ogg",  # 22.05 kHz stereo Ogg
}


@pytest.mark.parametrize("sr", [8000, 11025, 22050, 44100, 48000])
def test_resample_agrees_with_scipy_on_real_speech(sr):
    if sr in REAL_SPEECH_AT_RATE:
        x, file_sr = sf.read(FIXTURES / REAL_SPEECH_AT_RATE[sr], dtype="float32", always_2d=True)
        assert file_sr == sr
        x = x.mean(axis=1)
    else:   # no recording at this rate in fixtures: jfk taken up to it by the oracle itself
        x = oracle(jfk(), 16000, sr).astype(np.float32)
    y = resample(x, sr)
    ref = oracle(x, sr)
    assert y.dtype == np.float32
    assert len(y) == len(ref) == -(-len(x) * 16000 // sr)
    assert correlation(y, ref) >= 0.9999


@pytest.mark.parametrize("sr, freq", [(48000, 10000), (48000, 8500), (48000, 23000),
                                      (44100, 8450), (44100, 20000), (22050, 9000)])
def test_alias_rejection_at_least_80_db(sr, freq):
    """A tone above the new 8 kHz Nyquist comes out ≥ 80 dB below the same tone in band."""
    in_band = resample(tone(1000, sr), sr)
    aliased = resample(tone(freq, sr), sr)
    assert rms_db(aliased, in_band) <= -80.0


@pytest.mark.parametrize("freq", [100, 1000, 4000, 7000, 7500])
def test_passband_is_flat(freq):
    y = resample(tone(freq, 48000), 48000)
    assert abs(rms_db(y, tone(freq, 16000))) < 0.01


def test_upsampling_keeps_the_signal():
    x = tone(440, 8000)
    y = resample(x, 8000, 16000)
    assert len(y) == 2 * len(x)
    assert np.allclose(y[::2][100:-100], x[100:-100], atol=1e-4)   # old samples stay put


def test_resample_edge_cases():
    assert resample(np.zeros(0, np.float32), 48000).shape == (0,)
    assert resample(np.ones(1, np.float32), 48000).shape == (1,)
    x = np.arange(5, dtype=np.float32)
    assert np.array_equal(resample(x, 16000), x)
    with pytest.raises(ValueError, match="1-D"):
        resample(np.zeros((2, 10)), 48000)
    with pytest.raises(ValueError, match="sample rate"):
        resample(x, 16000.5)
    with pytest.raises(ValueError, match="sample rate"):
        resample(x, 2_000_000)


def test_filter_table_in_slices_matches_whole(monkeypatch):
    """Rate pairs with huge reduced ratios filter phase slices one at a time: same result."""
    x = oracle(jfk()[:16000], 16000, 44100).astype(np.float32)
    whole = resample(x, 44100)
    monkeypatch.setattr(audio, "MAX_TABLE", 3 * 320)   # 320 taps per phase at 44.1 kHz: 3 rows
    assert np.allclose(resample(x, 44100), whole, rtol=0, atol=1e-6)


def test_odd_rate_agrees_with_scipy():
    x = oracle(jfk()[:32000], 16000, 44101).astype(np.float32)   # 16000/44101: coprime
    assert correlation(resample(x, 44101), oracle(x, 44101)) >= 0.9999


# --- decoding ---------------------------------------------------------------------------------

# (soundfile format, subtype) → the format's bits per integer sample (None: float). We round
# to the format's codes ourselves and hand libsndfile integers it stores exactly (libsndfile's own
# float → int conversion scales by 2^(b-1) - 1, which is its choice, not the decoder's error).
FORMATS = {
    ("WAV", "PCM_U8"): 8,
    ("WAV", "PCM_16"): 16,
    ("WAV", "PCM_24"): 24,
    ("WAV", "PCM_32"): 32,
    ("WAV", "FLOAT"): None,
    ("WAV", "DOUBLE"): None,
    ("FLAC", "PCM_16"): 16,
    ("FLAC", "PCM_24"): 24,
}
# Resampling sums rounding errors through the filter: at most Σ|h| of one phase times the
# error, and Σ|h| ≤ 2.47 for 22.05/44.1/48 kHz → 16 kHz.
FILTER_L1 = 2.5


def in_format(x, subtype, bits):
    """x (float64 in [-1, 1)) as the array soundfile writes losslessly in `subtype`."""
    if bits is None:
        return x.astype(np.float64 if subtype == "DOUBLE" else np.float32)
    codes = np.round(x * 2.0 ** (bits - 1)).astype(np.int64)   # error ≤ half a step, 2^-bits
    if bits <= 16:   # libsndfile keeps the top `bits` bits of a short
        return (codes << (16 - bits)).astype(np.int16)
    return (codes << (32 - bits)).astype(np.int32)


@pytest.mark.parametrize("sr", [16000, 22050, 44100, 48000])
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("fmt", list(FORMATS), ids=lambda f: "-".join(f))
def test_every_format_decodes_to_the_same_16k_signal(tmp_path, fmt, channels, sr):
    """One source clip written at each depth, rate and channel count decodes to what resampling
    the unrounded source gives, within the format's rounding error; and every rate gives back
    jfk at 16 kHz."""
    container, subtype = fmt
    bits = FORMATS[fmt]
    source = 0.45 * oracle(jfk()[: 3 * 16000], 16000, sr)     # 3 s, room for the stereo part
    if channels == 1:
        data = in_format(source, subtype, bits)
    else:   # two different channels whose mean is the source
        d = 0.45 * np.sin(2 * np.pi * 300 * np.arange(len(source)) / sr)
        data = np.stack([in_format(source + d, subtype, bits),
                         in_format(source - d, subtype, bits)], axis=1)
    path = tmp_path / f"clip.{container.lower()}"
    sf.write(path, data, sr, format=container, subtype=subtype)
    got = load_audio(path)
    want = resample(source, sr) if sr != 16000 else source
    assert got.dtype == np.float32 and got.shape == want.shape
    rounding = 0.0 if bits is None else 2.0 ** -bits
    gain = 1.0 if sr == 16000 else FILTER_L1
    assert np.abs(got - want).max() <= gain * rounding + 1e-6     # 1e-6: float32 arithmetic
    # 8-bit samples carry audible noise of their own: they only reach r ≥ 0.999
    assert correlation(got, jfk()[: 3 * 16000]) >= (0.999 if bits == 8 else 0.9999)


def test_ogg_vorbis_decodes(tmp_path):
    """Lossy, so compared by correlation only; and the committed fillets-ng clips decode."""
    x = jfk()[: 3 * 16000]
    sf.write(tmp_path / "clip.ogg", 0.5 * x, 16000, format="OGG", subtype="VORBIS")
    assert correlation(load_audio(tmp_path / "clip.ogg"), x) >= 0.99
    for name in ("nl-vit-v-automat", "cs-vit-m-hlava"):
        y = load_audio(FIXTURES / "fillets" / f"{name}.ogg")
        assert y.dtype == np.float32 and y.ndim == 1 and len(y) > 16000


def test_stereo_fixture_equals_its_mono_twin():
    mono = load_audio(FIXTURES / "chan3.wav")
    stereo = load_audio(FIXTURES / "chan3.2chan.flac")
    assert len(mono) == -(-230108 * 16000 // 11025)
    assert np.array_equal(mono, stereo)


def test_every_kind_of_source_gives_the_same_samples():
    path = FIXTURES / "jfk.wav"
    data = path.read_bytes()
    want = load_audio(path)
    assert want.shape == (176000,) and want.dtype == np.float32
    assert np.array_equal(want, (jfk()).astype(np.float32))       # s16 / 32768, exactly
    for source in (str(path), data, bytearray(data), memoryview(data), io.BytesIO(data)):
        assert np.array_equal(load_audio(source), want)
    with open(path, "rb") as f:
        assert np.array_equal(load_audio(f), want)


def test_load_audio_to_another_rate():
    y = load_audio(FIXTURES / "jfk.wav", sr=8000)
    assert len(y) == 88000
    assert correlation(y, oracle(jfk(), 16000, 8000)) >= 0.9999


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, problem", [
    ("null.wav", "holds no audio samples"),
    ("bad.wav", "cannot decode audio: Error in WAV file. No 'data' chunk marker."),
    ("evil.wav", "cannot decode audio: Error in WAV file. No 'data' chunk marker."),
    ("awful.wav", "sample rate 1092676 Hz is outside the supported 1000–768000 Hz"),
])
def test_hostile_fixtures(name, problem):
    path = FIXTURES / "hostile" / name
    with pytest.raises(AudioError) as e:
        load_audio(path)
    assert str(e.value) == f"{path}: {problem}"
    with pytest.raises(AudioError, match="^audio bytes: "):
        load_audio(path.read_bytes())


def test_not_audio(tmp_path):
    cases = {
        "text.txt": b"And so my fellow Americans, ask not.\n",
        "random.wav": np.random.default_rng(0).bytes(4096),
        "truncated.wav": (FIXTURES / "jfk.wav").read_bytes()[:30],   # cut inside the header
        "empty.wav": b"",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(AudioError) as e:
            load_audio(tmp_path / name)
        message = str(e.value)
        assert message.startswith(f"{tmp_path / name}: ") and "\n" not in message
    assert "is empty (0 bytes)" in _error(tmp_path / "empty.wav")
    assert "Format not recognised" in _error(tmp_path / "text.txt")


def test_raw_pcm_is_not_guessed_but_has_its_own_reader():
    path = FIXTURES / "goforward.raw"
    assert "headerless raw audio" in _error(path)
    x = pcm16_to_float32(path.read_bytes())
    want, _ = sf.read(path, format="RAW", subtype="PCM_16", samplerate=16000, channels=1,
                      endian="LITTLE", dtype="float32")
    assert x.dtype == np.float32 and np.array_equal(x, want)
    assert np.array_equal(pcm16_to_float32(struct.pack("<3h", -32768, 0, 16384)),
                          np.array([-1.0, 0.0, 0.5], np.float32))
    with pytest.raises(AudioError, match="3 bytes is not a whole number of 2-byte samples"):
        pcm16_to_float32(b"\x00\x01\x02")


def test_missing_files_and_wrong_types(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_audio(tmp_path / "nothing.wav")
    with pytest.raises(IsADirectoryError):
        load_audio(tmp_path)
    with pytest.raises(TypeError, match="binary mode"):
        load_audio(io.StringIO("RIFF"))
    with pytest.raises(TypeError, match="not int"):
        load_audio(3)


def test_non_finite_float_samples_are_refused(tmp_path):
    x = np.zeros(1600, np.float32)
    x[100] = np.nan
    sf.write(tmp_path / "nan.wav", x, 16000, subtype="FLOAT")
    assert "non-finite" in _error(tmp_path / "nan.wav")


def _error(source):
    with pytest.raises(AudioError) as e:
        load_audio(source)
    return str(e.value)


def _small_wav(subtype, channels, sr):
    buf = io.BytesIO()
    x = 0.5 * np.sin(np.arange(800 * channels) / 7.0).reshape(800, channels)
    sf.write(buf, x, sr, format="WAV", subtype=subtype)
    return buf.getvalue()


SEEDS = [_small_wav("PCM_16", 1, 16000), _small_wav("PCM_24", 2, 44100),
         _small_wav("FLOAT", 1, 8000), _small_wav("PCM_U8", 2, 22050)]


@st.composite
def mutated_wav(draw):
    """A small valid WAV with a few bytes overwritten (mostly in the header), then maybe cut."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        end = draw(st.sampled_from([64, len(data)]))
        data[draw(st.integers(0, end - 1))] = draw(st.integers(0, 255))
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return bytes(data[:cut])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_wav())
def test_fuzz_only_audio_error_escapes(data):
    try:
        x = load_audio(data)
    except AudioError as e:
        assert str(e).startswith("audio bytes: ") and "\n" not in str(e)
    else:
        assert x.dtype == np.float32 and x.ndim == 1 and len(x) > 0
        assert np.isfinite(x).all()


def test_fixture_index_lists_real_files():
    lines = (FIXTURES / "index.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t") == ["path", "language", "sample_rate", "channels", "seconds",
                                    "transcript"]
    for line in lines[1:]:
        path, lang, sr, channels, seconds, text = line.split("\t")
        info = sf.info(FIXTURES / path)
        assert (info.samplerate, info.channels) == (int(sr), int(channels))
        assert abs(info.frames / info.samplerate - float(seconds)) < 1e-3 and text
    assert os.path.getsize(FIXTURES / "goforward.raw") == 89160


def _wav(n_bytes, declared):
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + n_bytes) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt +
            b"data" + struct.pack("<I", declared) + b"\0" * n_bytes)


def test_truncated_wav_is_refused(tmp_path):
    """A WAV whose data chunk is shorter than its header says: libsndfile would decode what is
    there; we refuse it, from bytes and from a file, and name the sizes."""
    assert load_audio(_wav(1000, 1000)).size == 500
    for streamed in (_wav(1000, 0xFFFFFFFF), _wav(1000, 0)):  # placeholder sizes: length unknown
        audio.check_wav_length(io.BytesIO(streamed), "streamed")
    audio.check_wav_length(io.BytesIO(b"fLaC" + b"\0" * 100), "not a WAV")
    cut = _wav(1000, 2000)
    with pytest.raises(AudioError, match="truncated WAV: its data chunk declares 2000 bytes of "
                                         "samples but only 1000 follow"):
        load_audio(cut)
    path = tmp_path / "cut.wav"
    path.write_bytes((FIXTURES / "jfk.wav").read_bytes()[:100_000])
    with pytest.raises(AudioError, match=f"{path}: truncated WAV"):
        load_audio(str(path))


def test_cli_names_a_missing_or_cut_file_without_a_traceback(tmp_path):
    import subprocess
    import sys

    cut = tmp_path / "cut.wav"
    cut.write_bytes((FIXTURES / "jfk.wav").read_bytes()[:50_000])
    for path, says in ((tmp_path / "missing.wav", "no such file"), (tmp_path, "is a directory"),
                       (cut, "truncated WAV")):
        r = subprocess.run([sys.executable, "-c", "from nwhisper.cli.main import main; main()",
                            "transcribe", str(path)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_load_channels_keeps_the_channels_apart(tmp_path):
    """Each channel as load_audio reads a mono file of it (to float32 rounding), and their mean
    is load_audio's mix; through libsndfile (WAV at 44.1 kHz, resampled) and PyAV (m4a)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((44100, 3)) * 0.1).astype(np.float32)
    sf.write(tmp_path / "three.wav", x, 44100, subtype="FLOAT")
    chans = load_channels(tmp_path / "three.wav")
    assert len(chans) == 3
    for c in range(3):
        sf.write(tmp_path / f"c{c}.wav", x[:, c], 44100, subtype="FLOAT")
        assert np.abs(chans[c] - load_audio(tmp_path / f"c{c}.wav")).max() < 1e-6
    assert np.abs(np.mean(chans, axis=0) - load_audio(tmp_path / "three.wav")).max() < 1e-6
    m4a = paths.fixture("containers", "speech.m4a")
    (one,) = load_channels(m4a)
    assert np.array_equal(one, load_audio(m4a))
    with pytest.raises(AudioError, match="cannot decode"):
        load_channels(b"not audio at all" * 10)
