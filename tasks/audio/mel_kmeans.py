"""A weight-free baseline tokenizer: log-mel frames assigned to the nearest centroid of a k-means codebook.

The codebook is fitted once (`fit_codebook`, k-means++ and Lloyd iterations in numpy, seeded) on a set of
utterances and saved as .npy; the embedded default ships one fitted on the bundled sample.
"""

from __future__ import annotations

import numpy as np

from tasks.audio.base import AudioTokenizer, AudioTokenizerError, dedup, hash_array
from tasks.sample import MEL_KMEANS_CODEBOOK

SAMPLE_RATE = 16000
HOP = 320  # 20 ms: 50 frames per second
WINDOW = 400  # 25 ms
N_MELS = 40


def log_mel(wave: np.ndarray) -> np.ndarray:
  """[frames, N_MELS] log-mel features, per-utterance mean-normalised."""
  import librosa

  mel = librosa.feature.melspectrogram(y=wave, sr=SAMPLE_RATE, n_fft=WINDOW, hop_length=HOP, n_mels=N_MELS)
  features = np.log(mel.T + 1e-6)
  return (features - features.mean(axis=0, keepdims=True)).astype(np.float32)


def _nearest(features: np.ndarray, centroids: np.ndarray) -> np.ndarray:
  distances = (features**2).sum(-1)[:, None] - 2 * features @ centroids.T + (centroids**2).sum(-1)[None]
  return distances.argmin(axis=-1)


def fit_codebook(features: np.ndarray, clusters: int, iterations: int = 25, seed: int = 0) -> np.ndarray:
  """k-means++ initialisation then Lloyd iterations; empty clusters are re-seeded from the farthest points."""
  rng = np.random.default_rng(seed)
  if len(features) < clusters:
    raise ValueError(f"{len(features)} frames cannot fit {clusters} clusters")
  centroids = [features[rng.integers(len(features))]]
  closest = ((features - centroids[0]) ** 2).sum(-1)
  for _ in range(clusters - 1):
    pick = rng.choice(len(features), p=closest / closest.sum())
    centroids.append(features[pick])
    closest = np.minimum(closest, ((features - features[pick]) ** 2).sum(-1))
  centroids = np.stack(centroids)
  for _ in range(iterations):
    assign = _nearest(features, centroids)
    counts = np.bincount(assign, minlength=clusters)
    sums = np.zeros_like(centroids)
    np.add.at(sums, assign, features)
    empty = counts == 0
    centroids[~empty] = sums[~empty] / counts[~empty, None]
    if empty.any():
      far = np.argsort(-((features - centroids[assign]) ** 2).sum(-1))[: empty.sum()]
      centroids[empty] = features[far]
  return centroids.astype(np.float32)


class MelKmeansTokenizer(AudioTokenizer):
  sample_rate = SAMPLE_RATE
  num_codebooks = 1

  def __init__(self, codebook_path: str, deduplicate: bool = False):
    self.codebook_path = codebook_path
    self.centroids = np.load(codebook_path).astype(np.float32)
    if self.centroids.ndim != 2 or self.centroids.shape[1] != N_MELS:
      raise AudioTokenizerError(
        f"{codebook_path}: a mel k-means codebook must be [clusters, {N_MELS}], got {self.centroids.shape}")
    self.codebook_sizes = (len(self.centroids),)
    self.deduplicate = deduplicate

  @classmethod
  def from_settings(cls, settings: dict, where) -> "MelKmeansTokenizer":
    """`codebook: bundled` (the default) is the sample's codebook; any other value a .npy path."""
    codebook = settings.get("codebook", "bundled")
    return cls(MEL_KMEANS_CODEBOOK if codebook == "bundled" else where(codebook), settings.get("dedup", False))

  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    codes = _nearest(log_mel(wave), self.centroids)[:, None].astype(np.int32)
    return dedup(codes) if self.deduplicate else codes

  def identity(self) -> dict:
    return {"type": "mel_kmeans", "clusters": len(self.centroids), "n_mels": N_MELS, "hop": HOP,
            "window": WINDOW, "dedup": self.deduplicate, "codebook_sha": hash_array(self.centroids)}
