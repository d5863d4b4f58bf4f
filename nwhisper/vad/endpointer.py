"""The endpointer: what cuts a live stream into utterances, one 32 ms chunk at a time.

A pure state machine: each step takes what a detector said about one 512-sample chunk (its
p(speech)) and the chunk's level in dBFS, and returns the events that chunk caused. No model, no
audio, no I/O, so the WebSocket server and `nwhisper vad` share it (nwhisper.vad.stream glues a
detector to it).

    ep = Endpointer(EndpointerOptions(partials=True))
    for p, db in per_chunk:
        for event in ep.step(p, db):
            ...                      # Start / Partial / End / Level (with stops=True: Stop; and
                                     # Drop), times on the stream's clock
    events = ep.flush()              # the stream ended: close what is open
    ep.end()                         # client command: the utterance is over now
    ep.reset()                       # client command: forget the open utterance

What it measures as it goes (docs/STREAMING.md has the whole picture):
- the noise floor: 20th percentile of the levels of the last 10 s of non-speech chunks;
- the speaker's level: 90th percentile of the last 20 s of chunks that were the speaker's voice;
- how readily the detector fires on this room's noise: the 90th percentile of p over the last
  10 s of chunks within 3 dB of the floor outside utterances (inside one they are the speaker's
  quieter syllables); the opening threshold is raised above it;
- faint voice: in a room whose noise the detector does not hear as speech (music, a fan), chunks
  of an open utterance that the detector hears but that sink into the noise's level (the
  speaker's quieter syllables, the detector's lingering after a word) stop the closing pause's
  clock for up to FAINT_CHUNKS without moving the voice's end; only once an utterance of the
  speaker's has closed and this one has reached their level;
- the near-field gate: a run of voice fewer than 3 of whose last 8 chunks come within `near_db`
  of the speaker's level (3 dB nearer to open an utterance than to keep one open) is someone
  else's voice (a television, a sibling) and neither opens an utterance nor keeps one open; in
  an open utterance a new run needs two chunks in a row within near_db (one is as often a
  quieter voice's loud syllable as the speaker's return), and its first holds the close;
- a nearer voice: 3 chunks of a run 6 dB above the speaker's level become the speaker's level;
  before any utterance has closed, the open one (opened on the quieter voice, the only level
  known then) is dropped (Drop: no End follows);
- an utterance whose loudest chunk of voice never came within REACH_DB of the speaker's level
  is someone else's too (a quieter voice's few loud syllables can open one; the speaker's words
  always reach their own level): when it would close, it is dropped instead (Drop);
- the closing pause, learned from the speaker's own gaps: 1.3 x their 90th percentile + 150 ms,
  within min_pause_ms..max_pause_ms, starting at start_pause_ms; a close followed quickly by more
  speech counts as a gap, so a speaker who keeps being cut mid-sentence stops being cut;
- `max_utt_ms`: an utterance that long is closed at its longest gap so far (or now, if it has
  none), and what followed the gap opens the next one.
"""

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

CHUNK_MS = 32                 # 512 samples at 16 kHz
NOISE_WINDOW_MS = 10_000      # the noise floor's memory
VOICE_WINDOW_MS = 20_000      # the speaker level's memory
NOISE_PCT = 20
VOICE_PCT = 90
GAP_PCT = 90
GAP_FACTOR = 1.3
GAP_PAD_MS = 150
MIN_GAP_MS = 64               # shorter dips are inside a word, not gaps between words
GAPS_KEPT = 30                # the learned pause looks at the speaker's last 30 gaps
MIN_GAPS = 3                  # ... once there are this many
QUICK_MS = 500                # speech this soon after a close means the close was a gap
NOISE_BAND_DB = 3.0           # chunks this close to the floor tell how the detector hears noise
THRESHOLD_MARGIN = 0.2        # the opening threshold stays this far above p on the room's noise
MAX_THRESHOLD = 0.9
HYSTERESIS = 0.15             # an open utterance continues down to threshold - 0.15 (Silero's)
MIN_SNR_DB = 3.0              # voice must stand this far above the floor
QUIET_DB = 20.0               # ... and be within this of the speaker's level: Silero stays sure
                              # for ~100 ms after a word's energy has gone, which is not voice
MIN_VOICE_CHUNKS = 5          # the speaker's level is trusted after this many voice chunks
ONSET_CHUNKS = 8              # a voice's start reaches back over the sound that led up to it
                              # (within QUIET_DB of the voice), at most 256 ms: Silero is late
GATE_BREAK = 2                # a run of voice ends after this many chunks without it (64 ms)
NEAR_WINDOW = 8               # the near-field gate looks at a run's last 8 chunks (256 ms) ...
NEAR_CHUNKS = 3               # ... of which this many must be within near_db of the speaker
OPEN_MARGIN_DB = 3.0          # opening asks a voice 3 dB nearer than continuing does (hysteresis,
                              # as the threshold's): a quieter voice's louder run opens nothing
LOUDER_DB = 6.0               # NEAR_CHUNKS of them this far above the speaker's level are a nearer
                              # voice, whose level is the speaker's from then on
FAINT_CHUNKS = 6              # faint voice stops the pause's clock for at most 192 ms
REACH_DB = 3.0                # an utterance's loudest voice chunk comes this near the speaker's
                              # level, or it was someone else's (built rooms: the speaker's
                              # answers +0.9..+6.3 dB, a television's blip 12 dB below: -4.7)


@dataclass(frozen=True)
class EndpointerOptions:
    """How the stream is cut. Times in ms; levels in dB."""

    threshold: float = 0.5        # p(speech) that opens an utterance (before the room raises it)
    near_db: float = 10.0         # the near-field gate; 0 = off
    pause_ms: int | None = None   # a fixed closing pause (turns learning off unless adaptive)
    adaptive: bool | None = None  # learn the pause (default: yes unless pause_ms is given)
    min_pause_ms: int = 300
    max_pause_ms: int = 1000
    start_pause_ms: int = 400
    max_utt_ms: int = 28_000      # whisper's window is 30 s
    partials: bool = False        # emit partial points
    partial_ms: int = 300         # one per this much new speech
    min_speech_ms: int = 96       # voice this long (within 160 ms) opens an utterance
    lead_ms: int = 300            # audio before the voice that an utterance includes
    tail_ms: int = 200            # ... and after it (a live stream may shorten it: Endpointer.tail_ms)
    level_ms: int = 1000          # a Level event this often; 0 = never
    room: bool = True             # raise the threshold above the room's noise
    stops: bool = False           # emit Stop when the voice has been silent for tail_ms
    legacy: bool = False          # label only: options() built these as the old endpointer

    def __post_init__(self):
        if self.pause_ms is not None and not 0 < self.pause_ms <= 10_000:
            raise ValueError(f"pause_ms must be in 1..10000, got {self.pause_ms}")
        if not 0 <= self.min_pause_ms <= self.max_pause_ms:
            raise ValueError(f"min_pause_ms {self.min_pause_ms} must be <= max_pause_ms "
                             f"{self.max_pause_ms}")
        if not 0 < self.max_utt_ms <= 28_000:
            raise ValueError(f"max_utt_ms must be in 1..28000, got {self.max_utt_ms}")
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")

    @property
    def learning(self):
        return self.adaptive if self.adaptive is not None else self.pause_ms is None

    @classmethod
    def legacy_options(cls, **kw):
        """The old endpointer: a fixed threshold and pause (800 ms unless given), no room
        measurement, no near-field gate, no learning."""
        kw.setdefault("pause_ms", 800)
        kw["pause_ms"] = kw["pause_ms"] or 800
        return cls(near_db=0.0, adaptive=False, room=False, legacy=True, **kw)


@dataclass(frozen=True)
class Start:
    """Speech began: utterance `seg` opens. t0 includes the lead-in; `at` is when it was known."""

    seg: int
    t0: float
    speech_t0: float
    at: float
    kind: str = field(default="start", init=False)


@dataclass(frozen=True)
class Partial:
    """A point to draft the open utterance: audio t0..t1 (t1 = now)."""

    seg: int
    t0: float
    t1: float
    at: float
    kind: str = field(default="partial", init=False)


@dataclass(frozen=True)
class Drop:
    """Utterance `seg` was someone else's: no End follows. why: "nearer" (a louder voice, the
    speaker's, came) or "quiet" (its voice never reached the speaker's level)."""

    seg: int
    at: float
    why: str = "nearer"
    kind: str = field(default="drop", init=False)


@dataclass(frozen=True)
class Stop:
    """The voice of utterance `seg` stopped tail_ms ago: t0..t1 (and speech_t0..speech_t1) are
    what End will say if the pause now closes with no more voice. A live stream starts
    transcribing that span here, while the pause runs, so that the answer is ready when it
    closes; more voice makes the span stale (End then says other times)."""

    seg: int
    t0: float
    t1: float
    speech_t0: float
    speech_t1: float
    at: float
    kind: str = field(default="stop", init=False)


@dataclass(frozen=True)
class End:
    """Utterance `seg` closed: transcribe t0..t1; the voice itself is speech_t0..speech_t1.

    reason: 'pause' (the closing pause ran out), 'max' (max_utt_ms, cut at its best gap),
    'end' (the client's end command) or 'eof' (the stream ended)."""

    seg: int
    t0: float
    t1: float
    speech_t0: float
    speech_t1: float
    reason: str
    at: float
    kind: str = field(default="end", init=False)


@dataclass(frozen=True)
class Level:
    """The room as measured now (once a second)."""

    noise_db: float
    speech_db: float | None
    snr_db: float | None
    p_noise: float
    pause_ms: int
    threshold: float
    at: float
    kind: str = field(default="level", init=False)


def _s(chunks):
    return round(chunks * CHUNK_MS / 1000, 3)


class Endpointer:
    """The state machine. Time is counted in chunks; events carry seconds."""

    def __init__(self, options=None, **kw):
        self.o = replace(options or EndpointerOptions(), **kw)
        self.n = 0                                   # chunks seen
        self.seg = 0                                 # utterances opened so far
        self.noise = deque(maxlen=NOISE_WINDOW_MS // CHUNK_MS)
        self.noise_p = deque(maxlen=NOISE_WINDOW_MS // CHUNK_MS)
        self.voice = deque(maxlen=VOICE_WINDOW_MS // CHUNK_MS)
        self.run = deque(maxlen=NEAR_WINDOW)         # levels of the current voice run's last chunks
        self.run_break = 0
        self.history = deque(maxlen=ONSET_CHUNKS + 8)
        self.gaps = deque(maxlen=GAPS_KEPT)          # the speaker's gaps, ms
        self.noise_db = -60.0
        self.speech_db = None
        self.p_noise = 0.0
        self.pause_ms = self.o.pause_ms or self.o.start_pause_ms   # learning starts from it
        self.tail_ms = self.o.tail_ms    # audio after the voice an utterance includes; a stream
                                         # lowers it when its answer would otherwise be late
        self.last_end = None                         # (closed at, speech end, t1) of the last close
        self.closes = 0                              # utterances closed so far
        self._forget()

    # -- the per-chunk step -------------------------------------------------------------------

    def step(self, p, level_db):
        """One 32 ms chunk: the detector's p(speech) and the chunk's RMS level in dBFS."""
        o = self.o
        n = self.n
        self.n += 1
        events = []
        self.history.append(level_db)

        threshold = self.threshold()
        clear = level_db >= self.noise_db + MIN_SNR_DB
        within = self.speech_db is None or level_db >= self.speech_db - QUIET_DB
        loud = not o.room or (clear and within)
        cut = threshold - HYSTERESIS if self.open else threshold
        candidate = p >= cut and loud
        faint = (o.room and self.open and p >= cut and within and not clear
                 and self.p_noise + THRESHOLD_MARGIN <= o.threshold and self.closes > 0
                 and self.speech_db is not None and self.peak >= self.speech_db - REACH_DB)
        # the near-field gate: NEAR_CHUNKS of a voice run's last NEAR_WINDOW chunks within near_db
        # of the speaker's level (while the run is younger than that, this chunk alone), so that
        # the quiet ends of the speaker's words pass, and a quieter voice's louder syllables do not
        if candidate:
            self.run.append(level_db)
            self.run_break = 0
        else:
            self.run_break += 1
            if self.run_break >= GATE_BREAK:
                self.run.clear()
        if candidate and o.near_db > 0 and self.speech_db is not None:
            events += self._louder_voice()
        near = o.near_db <= 0 or self.speech_db is None
        unconfirmed = False
        if not near:
            gate = self.speech_db - o.near_db + (0.0 if self.open else OPEN_MARGIN_DB)
            near = (sum(v >= gate for v in self.run) >= NEAR_CHUNKS
                    or (len(self.run) < NEAR_WINDOW and level_db >= gate
                        and (not self.open or len(self.run) > 1 and self.run[-2] >= gate)))
            unconfirmed = candidate and not near and level_db >= gate
        voiced = candidate and near

        # the room: non-speech chunks feed the floor, chunks near the floor tell how the
        # detector hears noise, the speaker's voice feeds their level
        if voiced:
            if self.open or self.pending:
                self.voice.append(level_db)
            if self.open:
                self.peak = max(self.peak, level_db)
        else:
            self.noise.append(level_db)
        if not (self.open or voiced) and level_db <= self.noise_db + NOISE_BAND_DB:
            self.noise_p.append(p)
        if n % 4 == 0:
            self._measure()

        if voiced:
            if not self.open:
                self.pending.append(n)
                while self.pending and n - self.pending[0] >= 5:   # voice within 160 ms
                    self.pending.popleft()
                if len(self.pending) * CHUNK_MS >= o.min_speech_ms:
                    events += self._open(self.pending[0], n)
            else:
                silent = n - self.speech_end                      # chunks since the voice
                if silent * CHUNK_MS >= MIN_GAP_MS:
                    self._gap(silent * CHUNK_MS)
                    self.candidates.append((self.speech_end, n))
                self.speech_end = n + 1
                self.faint = 0
                self.voiced_since_partial += 1
        elif not self.open and self.pending and n - self.pending[-1] >= 5:
            self.pending.clear()

        if self.open:
            if o.partials and self.voiced_since_partial * CHUNK_MS >= o.partial_ms:
                self.voiced_since_partial = 0
                events.append(Partial(self.seg, _s(self.t0), _s(n + 1), _s(n + 1)))
            faint = faint and not voiced and self.faint < FAINT_CHUNKS
            self.faint += faint
            silent_ms = (n + 1 - self.speech_end - self.faint) * CHUNK_MS
            tail = self.tail_ms // CHUNK_MS
            if silent_ms >= self.pause_ms and not unconfirmed:
                events.append(self._finish("pause", n + 1))
            elif o.stops and not (voiced or faint) and silent_ms == tail * CHUNK_MS:
                events.append(Stop(self.seg, _s(self.t0), _s(self.speech_end + tail),
                                   _s(self.speech_start), _s(self.speech_end), _s(n + 1)))
            elif (n + 1 - self.t0) * CHUNK_MS >= o.max_utt_ms:
                events += self._split(n + 1)

        if o.level_ms and (n + 1) % max(1, o.level_ms // CHUNK_MS) == 0:
            events.append(self.level(_s(n + 1)))
        return events

    # -- commands -----------------------------------------------------------------------------

    def end(self):
        """The client says the utterance is over: close it now. Returns [End] (or [Drop]) or []."""
        return [self._finish("end", self.n)] if self.open else []

    def flush(self):
        """The stream ended: close what is open. Returns [End] (or [Drop]) or []."""
        return [self._finish("eof", self.n)] if self.open else []

    def reset(self):
        """Forget the open utterance (no End for it); the room and the learned pause stay."""
        self._forget()

    def reconfigure(self, options):
        """New options mid-stream (a client's config message): what was measured of the room
        and the speaker stays; a fixed pause_ms takes effect at once, a learned one is
        re-derived within the new range."""
        self.o = options
        self.tail_ms = min(self.tail_ms, options.tail_ms)
        if options.pause_ms is not None:
            self.pause_ms = options.pause_ms
        if options.learning:
            self.pause_ms = int(min(options.max_pause_ms, max(options.min_pause_ms, self.pause_ms)))
            if len(self.gaps) >= MIN_GAPS:
                self._gap(self.gaps.pop())

    # -- what it measures ---------------------------------------------------------------------

    def threshold(self):
        if not self.o.room:
            return self.o.threshold
        return max(self.o.threshold, min(MAX_THRESHOLD, self.p_noise + THRESHOLD_MARGIN))

    def level(self, at):
        snr = None if self.speech_db is None else round(self.speech_db - self.noise_db, 1)
        return Level(round(self.noise_db, 1),
                     None if self.speech_db is None else round(self.speech_db, 1), snr,
                     round(self.p_noise, 3), int(self.pause_ms), round(self.threshold(), 3), at)

    def _measure(self):
        if self.noise:
            self.noise_db = float(np.percentile(self.noise, NOISE_PCT))
        if len(self.noise_p) >= 10:
            self.p_noise = float(np.percentile(self.noise_p, 90))
        if len(self.voice) >= MIN_VOICE_CHUNKS:
            self.speech_db = float(np.percentile(self.voice, VOICE_PCT))

    def _gap(self, ms):
        """A gap between the speaker's words (or a close that speech quickly followed)."""
        if not self.o.learning:
            return
        self.gaps.append(ms)
        if len(self.gaps) >= MIN_GAPS:
            learned = GAP_FACTOR * float(np.percentile(self.gaps, GAP_PCT)) + GAP_PAD_MS
            self.pause_ms = int(min(self.o.max_pause_ms, max(self.o.min_pause_ms, learned)))

    def _louder_voice(self):
        """NEAR_CHUNKS chunks of a run LOUDER_DB above the speaker's level: the level is learnt
        anew from this voice. Before any utterance has closed, the level came from the open
        utterance alone, so that utterance was someone else's (a television talking before the
        speaker's first word): it is dropped (Drop), and the speaker's words open their own."""
        louder = [v for v in self.run if v >= self.speech_db + LOUDER_DB]
        if len(louder) < NEAR_CHUNKS:
            return []
        self.voice.clear()
        self.voice.extend(louder)
        self.speech_db = float(np.percentile(self.voice, VOICE_PCT))
        if not self.open or self.closes:       # the level was the speaker's: they got louder
            return []
        seg = self.seg
        self._forget()
        return [Drop(seg, _s(self.n))]

    # -- opening and closing ------------------------------------------------------------------

    def _forget(self):
        self.open = False
        self.pending = deque()
        self.t0 = self.speech_start = self.speech_end = 0
        self.candidates = []                          # (silence start, silence end) chunks
        self.voiced_since_partial = 0
        self.faint = 0                                # faint chunks since the voice's end
        self.peak = -200.0                            # the loudest voice chunk since it opened

    def _open(self, first, n):
        o = self.o
        lead = o.lead_ms // CHUNK_MS
        floor = self.last_end[2] if self.last_end else 0
        if self.last_end is not None:
            closed_at, speech_t1, _ = self.last_end
            if (first - closed_at) * CHUNK_MS <= QUICK_MS:    # the close was really a gap
                self._gap((first - speech_t1) * CHUNK_MS)
        # Silero is sure only some chunks into a word: start where the sound rose from the floor
        levels = list(self.history)                   # levels[-1] is chunk n
        self.peak = max(levels[first - n - 1:])       # the voice that opened it
        voice = self.speech_db if self.speech_db is not None else max(levels[first - n - 1:])
        onset = max(self.noise_db + MIN_SNR_DB, voice - QUIET_DB)
        back = first
        while (first - back < ONSET_CHUNKS and back - 1 > floor and n - (back - 1) < len(levels)
               and levels[-1 - (n - (back - 1))] >= onset):
            back -= 1
        first = back
        self.seg += 1
        self.open = True
        self.t0 = max(first - lead, floor, 0)
        self.speech_start = first
        self.speech_end = n + 1
        self.voiced_since_partial = len(self.pending)
        self.pending.clear()
        self.candidates = []
        return [Start(self.seg, _s(self.t0), _s(first), _s(n + 1))]

    def _finish(self, reason, at):
        """The open utterance's End — or its Drop, if its voice never reached the speaker's
        level (someone else's: nothing of it is the speaker's, so it teaches nothing)."""
        if (self.o.near_db > 0 and self.speech_db is not None and self.closes
                and self.peak < self.speech_db - REACH_DB):
            seg = self.seg
            self._forget()
            return Drop(seg, _s(at), "quiet")
        return self._close(reason, at)

    def _close(self, reason, at, speech_end=None):
        speech_end = self.speech_end if speech_end is None else speech_end
        t1 = min(speech_end + self.tail_ms // CHUNK_MS, at)
        event = End(self.seg, _s(self.t0), _s(t1), _s(self.speech_start), _s(speech_end),
                    reason, _s(at))
        self.last_end = (at, speech_end, t1)
        self.closes += 1
        self._forget()
        return event

    def _split(self, at):
        """max_utt_ms reached: close at the longest gap so far, reopen after it."""
        if not self.candidates:
            end = self._close("max", at)
            self.last_end = None                       # not a pause: teaches nothing
            return [end]
        # the best gap: the longest, or a later one nearly as long (3/4 of it), so that what
        # follows the cut is short and not cut again at once
        longest = max(g[1] - g[0] for g in self.candidates)
        gap_start, gap_end = [g for g in self.candidates if 4 * (g[1] - g[0]) >= 3 * longest][-1]
        later = [g for g in self.candidates if g[0] >= gap_end]
        resume_end = self.speech_end
        mid = (gap_start + gap_end) // 2
        end = self._close("max", at, speech_end=gap_start)
        t1 = min(gap_start + self.tail_ms // CHUNK_MS, mid)
        end = replace(end, t1=_s(t1))
        self.last_end = None
        self.seg += 1
        self.open = True
        self.t0 = max(gap_end - self.o.lead_ms // CHUNK_MS, t1)
        self.speech_start = gap_end
        self.speech_end = resume_end
        self.candidates = later
        return [end, Start(self.seg, _s(self.t0), _s(gap_end), _s(at))]
