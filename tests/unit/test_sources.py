"""sources.py: what the window loop reads, and the clocks back to the recording (pure logic: a
regions function stands in for a VAD)."""

import collections

import numpy as np

from nwhisper import sources
from paths import fixture

SR = 16000


def test_the_whole_recording_is_one_piece_on_its_own_clock():
    x = np.zeros(SR * 2, np.float64)
    src = sources.of(x)
    (piece,) = src.pieces
    assert piece.samples.dtype == np.float32 and len(piece.samples) == 2 * SR and piece.clock is None
    assert src.duration == 2.0 and src.speech_regions is None and not src.chunked
    assert sources.of(fixture("jfk.wav")).pieces[0].samples is None   # a file: read by the loop, in passes


def test_speech_is_joined_on_a_clock_back_to_the_recording():
    x = np.arange(10 * SR, dtype=np.float32)
    src = sources.of(x, vad=lambda s, sr: [(1 * SR, 2 * SR), (5 * SR, 7 * SR)])
    (piece,) = src.pieces
    assert np.array_equal(piece.samples, np.concatenate([x[SR:2 * SR], x[5 * SR:7 * SR]]))
    assert src.duration == 10.0 and src.duration_after_vad == 3.0
    assert src.speech_regions == [(1.0, 2.0), (5.0, 7.0)]
    assert piece.clock(0.5) == 1.5 and piece.clock(1.5) == 5.5 and piece.clock(1.0, end=True) == 2.0


def test_no_speech_is_no_piece():
    src = sources.of(np.zeros(SR, np.float32), vad=lambda s, sr: [])
    assert src.pieces == [] and src.duration == 1.0 and src.duration_after_vad == 0.0
    assert src.speech_regions == []


def test_a_chunk_whose_text_ended_early_has_its_rest_as_a_piece_of_its_own():
    x = np.arange(20 * SR, dtype=np.float32)
    piece = sources.chunk_piece(x, [(0, 4 * SR), (10 * SR, 14 * SR)])
    assert len(piece.samples) == 8 * SR
    assert piece.rest(7.5) is None                  # ≤ REST_S of speech after the text
    rest = piece.rest(2.0)                          # 2 s into the joined speech: 2 s in the recording
    assert rest.spans == [(2 * SR, 4 * SR), (10 * SR, 14 * SR)]
    assert np.array_equal(rest.samples, np.concatenate([x[2 * SR:4 * SR], x[10 * SR:14 * SR]]))
    assert rest.clock(0.0) == 2.0 and rest.clock(2.5) == 10.5
    assert sources.Piece(x).rest(0.0) is None       # only a chunk has a rest


def test_a_rest_rides_in_the_first_next_window_with_room_for_it():
    x = np.arange(100 * SR, dtype=np.float32)
    rest = sources.chunk_piece(x, [(2 * SR, 5 * SR)])                      # 3 s
    full = sources.chunk_piece(x, [(10 * SR, 38 * SR)])                    # 28 s: no room
    roomy = sources.chunk_piece(x, [(40 * SR, 50 * SR), (52 * SR, 60 * SR)])
    later = sources.chunk_piece(x, [(70 * SR, 75 * SR)])
    queue = collections.deque([full, roomy, later])
    sources.requeue(queue, rest, within=2)
    assert [p.spans for p in queue] == [full.spans, [(2 * SR, 5 * SR), (40 * SR, 50 * SR),
                                                     (52 * SR, 60 * SR)], later.spans]
    merged = queue[1]
    assert np.array_equal(merged.samples, np.concatenate([x[2 * SR:5 * SR], x[40 * SR:50 * SR],
                                                          x[52 * SR:60 * SR]]))
    assert merged.clock(1.0) == 3.0 and merged.clock(4.0) == 41.0      # each part on its own clock
    # none of the next `within` windows has room: a window of its own, decoded next
    queue = collections.deque([full, later])
    sources.requeue(queue, rest, within=1)
    assert [p.spans for p in queue] == [rest.spans, full.spans, later.spans]
