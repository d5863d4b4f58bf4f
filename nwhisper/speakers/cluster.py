"""Speaker embeddings → speaker labels, in NumPy and SciPy.

    labels = cluster(emb)                          # the number of speakers estimated
    labels = cluster(emb, num_speakers=2)          # or given
    labels = cluster(emb, min_speakers=2, max_speakers=4)
    nearest(new_emb, emb, labels)                  # labels of more windows, by the centroids

Embeddings are compared by cosine similarity. Few windows (a short recording) are grouped by
agglomerative clustering (average linkage) cut at a similarity; many by spectral clustering: the
similarity matrix pruned to each window's nearest neighbours (which keeps one speaker's windows
connected and cuts the weak links between speakers), its Laplacian's eigengap choosing the number
of speakers, k-means on the leading eigenvectors. Then, when the count was not given, clusters whose
centroids are as alike as one speaker's windows are merged, and clusters of a few windows (a
cough, a laugh, a word in an overlap) are folded into the nearest large one. Labels are numbered
by first appearance.
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.cluster.vq import kmeans2

SPECTRAL_FROM = 40         # windows (a minute of speech in 1.5 s windows): spectral from here
SAME_SPEAKER = 0.45        # cosine similarity above which two windows' clusters are one speaker
MERGE_SAME = 0.6           # centroids this alike are one speaker (centroids are less noisy)
PRUNE = 0.1                # spectral: each window keeps its nearest tenth of the others ...
PRUNE_MIN = 6              # ... and at least this many
SMALL = 3                  # clusters of fewer windows are folded into the nearest large one
MAX_SPEAKERS = 16


def cluster(emb, num_speakers=None, min_speakers=None, max_speakers=None, seed=0):
    """(n, d) embeddings → n labels 0..k-1."""
    emb = np.asarray(emb, np.float64)
    n = len(emb)
    lo, hi = _bounds(n, num_speakers, min_speakers, max_speakers)
    if n == 0:
        return np.zeros(0, np.int64)
    if hi == 1 or n == 1:
        return np.zeros(n, np.int64)
    x = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    if n < SPECTRAL_FROM:
        labels = _agglomerative(x, lo, hi)
    else:
        labels = _spectral(x, lo, hi, seed)
    if num_speakers is None:
        labels = _merge_alike(x, labels, lo)
        labels = _fold_small(x, labels, lo)
    return _by_first_appearance(labels)


def nearest(emb, known, labels):
    """The label of the centroid (mean of `known`'s unit embeddings under `labels`) each of
    `emb` is most similar to."""
    x = np.asarray(known, np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    ks, c = _centroids(x, np.asarray(labels))
    e = np.asarray(emb, np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    return ks[np.argmax(e @ c.T, axis=1)]


def _bounds(n, num, lo, hi):
    if num is not None:
        if num < 1:
            raise ValueError(f"num_speakers must be at least 1, not {num}")
        if lo is not None or hi is not None:
            raise ValueError("give num_speakers, or min_speakers/max_speakers, not both")
        k = min(num, max(n, 1))
        return k, k
    lo = 1 if lo is None else lo
    hi = MAX_SPEAKERS if hi is None else hi
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 ≤ min_speakers ≤ max_speakers, not {lo} and {hi}")
    return min(lo, max(n, 1)), min(hi, max(n, 1))


def _agglomerative(x, lo, hi):
    z = linkage(x, method="average", metric="cosine")
    labels = fcluster(z, t=1 - SAME_SPEAKER, criterion="distance")
    k = len(set(labels))
    if not lo <= k <= hi:
        labels = fcluster(z, t=min(max(k, lo), hi), criterion="maxclust")
    return labels - 1


def _spectral(x, lo, hi, seed):
    n = len(x)
    s = np.clip(x @ x.T, 0, None)
    keep = max(int(PRUNE * n), PRUNE_MIN)
    # each row keeps its `keep` most similar windows, then the graph is made symmetric
    nearest = np.argsort(-s, axis=1)[:, :keep]
    a = np.zeros_like(s)
    np.put_along_axis(a, nearest, np.take_along_axis(s, nearest, axis=1), axis=1)
    a = (a + a.T) / 2
    np.fill_diagonal(a, 0)
    lap = np.diag(a.sum(axis=1)) - a
    values, vectors = np.linalg.eigh(lap)
    gaps = np.diff(values[:hi + 1])
    k = lo + int(np.argmax(gaps[lo - 1:hi])) if hi > lo else lo
    v = vectors[:, :k]
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    _, labels = kmeans2(v, k, minit="++", seed=np.random.default_rng(seed), iter=30)
    return labels


def _centroids(x, labels):
    ks = np.unique(labels)
    c = np.stack([x[labels == k].mean(axis=0) for k in ks])
    return ks, c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)


def _merge_alike(x, labels, lo):
    """Join the two most alike clusters while their centroids' similarity is MERGE_SAME or more
    and more than `lo` clusters remain."""
    labels = labels.copy()
    while True:
        ks, c = _centroids(x, labels)
        if len(ks) <= lo:
            return labels
        sim = c @ c.T
        np.fill_diagonal(sim, -1)
        i, j = np.unravel_index(np.argmax(sim), sim.shape)
        if sim[i, j] < MERGE_SAME:
            return labels
        labels[labels == ks[j]] = ks[i]


def _fold_small(x, labels, lo):
    """Clusters of fewer than SMALL windows go to the large cluster their windows are most like,
    keeping at least `lo` clusters."""
    labels = labels.copy()
    sizes = {k: int(np.sum(labels == k)) for k in np.unique(labels)}
    large = [k for k, m in sizes.items() if m >= SMALL]
    small = sorted((k for k, m in sizes.items() if m < SMALL), key=lambda k: sizes[k])
    if not large:
        return labels
    while small and len(large) + len(small) > lo:
        k = small.pop(0)
        ks, c = _centroids(x, labels)
        big = np.array([kk in large for kk in ks])
        target = ks[big][np.argmax((x[labels == k] @ c[big].T).mean(axis=0))]
        labels[labels == k] = target
    return labels


def _by_first_appearance(labels):
    order = {}
    for k in labels:
        order.setdefault(k, len(order))
    return np.array([order[k] for k in labels], np.int64)
