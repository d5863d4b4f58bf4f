"""Speaker clustering (nwhisper/speakers/cluster.py) on synthetic embeddings whose speakers are known.

Each speaker is a random direction in 192 dimensions; a window is its speaker's direction plus
noise, scaled so a window's cosine similarity to its speaker's centre is about 0.75 and two
speakers' windows are near 0 (what CAM++ gives on clean speech). Both methods are covered:
agglomerative below cluster.SPECTRAL_FROM windows, spectral from there.
"""

import numpy as np
import pytest

from nwhisper.speakers.cluster import SPECTRAL_FROM, cluster, nearest

DIM = 192
NOISE = 0.9 / np.sqrt(DIM)     # per dimension: |noise| ≈ 0.9, so cosine to the centre ≈ 0.75


def speakers(sizes, seed=0, order="turns"):
    """Embeddings of len(sizes) speakers with sizes[k] windows each, and their true labels; in
    turns (a few windows of one speaker, then another's) so first appearance is 0, 1, 2 …"""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(sizes), DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    left, labels = list(sizes), []
    while any(left):
        for k in range(len(sizes)):
            take = min(left[k], 4)
            labels += [k] * take
            left[k] -= take
    labels = np.array(labels)
    emb = centres[labels] + rng.normal(scale=NOISE, size=(len(labels), DIM))
    return emb.astype(np.float32), labels


def same_partition(a, b):
    """Equal up to renaming (both are numbered by first appearance, so equal outright)."""
    return np.array_equal(a, b)


@pytest.mark.parametrize("sizes", [(12, 10), (8, 9, 7), (40, 35), (30, 30, 25), (25, 20, 20, 18)])
def test_known_speakers_are_found(sizes):
    emb, truth = speakers(sizes)
    labels = cluster(emb)
    method = "spectral" if len(emb) >= SPECTRAL_FROM else "agglomerative"
    assert same_partition(labels, truth), method


@pytest.mark.parametrize("sizes", [(12, 10), (40, 35, 30)])
def test_count_given(sizes):
    emb, truth = speakers(sizes)
    k = len(sizes)
    assert same_partition(cluster(emb, num_speakers=k), truth)
    assert len(set(cluster(emb, num_speakers=k - 1))) == k - 1
    assert len(set(cluster(emb, num_speakers=k + 1))) == k + 1


@pytest.mark.parametrize("n", [20, 60])
def test_bounds(n):
    four, _ = speakers((n // 4,) * 4, seed=1)
    assert len(set(cluster(four, max_speakers=2))) <= 2
    assert len(set(cluster(four, min_speakers=2, max_speakers=3))) in (2, 3)
    one, _ = speakers((n,), seed=2)
    assert len(set(cluster(one))) == 1
    assert len(set(cluster(one, min_speakers=2))) >= 2


def test_a_few_stray_windows_join_a_speaker():
    """Two windows of a third voice (a cough, a word in an overlap) are no speaker of their own
    when the count is estimated."""
    emb, _ = speakers((30, 30, 2), seed=3)
    assert len(set(cluster(emb))) == 2
    assert len(set(cluster(emb, num_speakers=3))) == 3


def test_one_window_and_none():
    assert cluster(np.zeros((0, DIM), np.float32)).shape == (0,)
    assert list(cluster(np.ones((1, DIM), np.float32))) == [0]
    assert list(cluster(np.ones((1, DIM), np.float32), num_speakers=3)) == [0]
    two, _ = speakers((1, 1), seed=4)
    assert len(cluster(two)) == 2


def test_labels_by_first_appearance_and_repeatable():
    emb, _ = speakers((20, 20, 20), seed=5)
    labels = cluster(emb[::-1].copy())
    firsts = [int(np.flatnonzero(labels == k)[0]) for k in range(labels.max() + 1)]
    assert labels[0] == 0 and firsts == sorted(firsts)
    assert np.array_equal(labels, cluster(emb[::-1].copy()))


@pytest.mark.parametrize("kwargs", [dict(num_speakers=0), dict(num_speakers=2, min_speakers=1),
                                    dict(min_speakers=3, max_speakers=2), dict(min_speakers=0)])
def test_bad_counts_are_refused(kwargs):
    emb, _ = speakers((5, 5))
    with pytest.raises(ValueError):
        cluster(emb, **kwargs)


def test_nearest_centroid_labels_new_windows():
    emb, truth = speakers((10, 10, 10), seed=6)
    more, more_truth = speakers((3, 3, 3), seed=6)      # same centres (same seed), new noise
    rng = np.random.default_rng(7)
    more = more + rng.normal(scale=NOISE, size=more.shape)
    assert np.array_equal(nearest(more, emb, truth), more_truth)
