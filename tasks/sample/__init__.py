"""The bundled sample: a small benchmark in the S2SBench release layout, written by this project (no public data).

`release/` holds 24 English stories, 24 Chinese stories and 24 Chinese four-option statements with their spoken
first halves and spoken candidates (espeak-ng, 16 kHz), and tStoryCloze drawn from the English stories;
`mel_kmeans_256.npy` is the mel k-means codebook fitted on the three S2SBench tasks' prefixes.
Regenerate both with `python -m tasks.sample.make_sample` (needs espeak-ng and sox).
"""

import os

SAMPLE_DIR = os.path.dirname(os.path.abspath(__file__))
RELEASE_DIR = os.path.join(SAMPLE_DIR, "release")
MEL_KMEANS_CODEBOOK = os.path.join(SAMPLE_DIR, "mel_kmeans_256.npy")
