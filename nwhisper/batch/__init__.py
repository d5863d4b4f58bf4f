"""`nwhisper batch`: archives of recordings, on this machine or a Ray cluster.

jobs.py says what a batch is (inputs, outputs, resume), work.py what one worker does, pool.py and
on_ray.py where the workers run, run.py the progress and the summary.
"""
