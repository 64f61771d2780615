"""The interface every audio tokenizer implements, and audio loading."""

from __future__ import annotations

import abc
import hashlib

import numpy as np


class AudioError(ValueError):
  """Audio that cannot be used: missing, unreadable, empty. Names the file."""


def load_audio(path: str, sample_rate: int) -> np.ndarray:
  """Mono float32 waveform at `sample_rate` (resampled by librosa when the file's rate differs)."""
  import os

  import librosa

  if not os.path.exists(path):
    raise AudioError(f"audio file {path} does not exist")
  try:
    wave, _ = librosa.load(path, sr=sample_rate, mono=True)
  except Exception as e:  # soundfile/audioread raise many types for corrupt files
    raise AudioError(f"audio file {path} cannot be read ({type(e).__name__}: {e})") from e
  if wave.size == 0:
    raise AudioError(f"audio file {path} holds no samples")
  return wave.astype(np.float32)


def dedup(codes: np.ndarray) -> np.ndarray:
  """Collapses runs of identical consecutive frames (TWIST / SIMS unit sequences)."""
  if len(codes) == 0:
    return codes
  keep = np.ones(len(codes), bool)
  keep[1:] = (codes[1:] != codes[:-1]).any(axis=-1)
  return codes[keep]


class AudioTokenizer(abc.ABC):
  """waveform [samples] at `sample_rate` -> int32 codes [frames, num_codebooks]."""

  sample_rate: int
  num_codebooks: int
  codebook_sizes: tuple[int, ...]
  reads_audio: bool = True  # False: codes come from elsewhere by uttid, the wav is not decoded

  @abc.abstractmethod
  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    """Codes of one utterance; `uttid` names it (precomputed tokenizers look it up by name)."""

  @abc.abstractmethod
  def identity(self) -> dict:
    """What determines the codes (type, settings, weights): recorded with the dataset."""

  def fingerprint(self) -> str:
    """A short hash of `identity()` and the weights behind it: `tasks.prepare` refuses to reuse data built with
    another tokenizer (the fingerprint is part of the built data's `inputs`)."""
    return hashlib.sha256(repr(sorted(self.identity().items())).encode()).hexdigest()[:16]


def folder_digest(directory: str, suffix: str) -> str:
  """A hash of the names and bytes of every `*suffix` file in `directory`: contents, not times, so a copied folder
  hashes the same and a file rewritten in place does not."""
  import os

  digest = hashlib.sha256()
  for name in sorted(n for n in os.listdir(directory) if n.endswith(suffix)):
    digest.update(name.encode() + b"\0")
    with open(os.path.join(directory, name), "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()[:16]


def hash_array(array: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]
