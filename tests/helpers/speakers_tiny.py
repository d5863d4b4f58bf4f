"""A tiny CAM++ with random weights, and test signals for it, for the tests that need the
network's every step but not its trained weights (the CUDA simulator runs one Python thread per
CUDA thread: the real network's 0.8 G multiply-adds a 1.5 s window would take hours there)."""

import numpy as np

from nwhisper.speakers import weights

# 16 fbank bins (the front end halves them to 2), 4 channels, two dense blocks of two layers
DIMS = weights.Dims(feat_dim=16, m_channels=4, init_channels=8, growth_rate=4, bn_size=2,
                    blocks=((2, 3, 1), (2, 3, 2)), embedding_size=6)


def random_state(dims=DIMS, seed=43):
    """A state dict of `dims` in the checkpoint's names: convolutions He-initialised (std
    sqrt(2 / fan-in), which keeps activations near 1 through the ReLUs), norms near identity,
    biases and shifts small. With larger shifts most ReLUs end up closed and every window gets
    the same embedding, which would make a comparison of two implementations prove little."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, shape in weights.spec(dims).items():
        if name.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("weight") and len(shape) > 1:
            a = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        elif name.endswith("weight"):                  # a norm's scale
            a = 1 + rng.standard_normal(shape) * 0.3
        else:
            a = rng.standard_normal(shape) * 0.1
        state[name] = a.astype(np.float32)
    return state


def voices(count, samples, seed=5):
    """(count, samples) f32 at 16 kHz: each a tone of its own pitch and level in noise of its own
    level, so that the windows' features, and so their embeddings, differ."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / 16000
    return np.stack([np.sin(2 * np.pi * rng.uniform(100, 3000) * t) * rng.uniform(0.05, 0.5)
                     + rng.standard_normal(samples) * rng.uniform(0.001, 0.1)
                     for _ in range(count)]).astype(np.float32)
