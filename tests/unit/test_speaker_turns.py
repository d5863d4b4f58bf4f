"""Speaker turns from labelled windows (nwhisper/speakers/diarize.py): where the windows go, the
windows added at a change of speaker, and how turns are cut between windows. Samples at 16 kHz."""

from nwhisper.speakers.diarize import SAMPLE_RATE, STEP_S, WINDOW_S, Turn, straddling, turns, windows

W, STEP = int(WINDOW_S * SAMPLE_RATE), int(STEP_S * SAMPLE_RATE)


def test_windows_cover_each_region_to_its_end():
    spans = windows([(0, 4 * W + 100), (5 * W, 5 * W + W // 2), (7 * W, 7 * W + 100)])
    assert spans[0] == (0, W) and spans[-2][1] == 4 * W + 100      # the last one ends at the end
    assert all(b - a == W for a, b in spans[:-1])
    assert spans[-1] == (5 * W, 5 * W + W // 2)       # a short region is one window; 100 samples none


def test_a_window_straddles_each_change_inside_a_region():
    spans = [(0, W), (W, 2 * W), (2 * W, 3 * W), (4 * W, 5 * W)]
    labels = [0, 1, 1, 0]                 # a change inside the region, and one across a pause
    assert straddling(spans, labels) == [(W // 2, W // 2 + W)]
    short = [(0, W), (W, W + W // 2)]     # a shorter last window: the straddling one is as short
    (a, b), = straddling(short, [0, 1])
    assert b - a == W // 2 and 0 <= a and b <= W + W // 2


def test_turns_split_overlaps_halfway_and_join_one_speaker():
    sr = SAMPLE_RATE
    spans = [(0, 3 * sr), (2 * sr, 5 * sr), (4 * sr, 7 * sr), (8 * sr, 9 * sr)]
    assert turns(spans, [0, 0, 1, 1]) == [Turn(0.0, 4.5, 0), Turn(4.5, 7.0, 1), Turn(8.0, 9.0, 1)]
    assert turns([], []) == []
