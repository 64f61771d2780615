"""The interface every audio tokenizer implements, and audio loading."""

from __future__ import annotations

import abc
import collections
import hashlib

import numpy as np

from s2sjax.errors import UserError
from s2sjax.progress import Progress


class AudioError(UserError, ValueError):
  """Audio that cannot be used: missing, unreadable, empty. Names the file."""


class AudioTokenizerError(UserError, ValueError):
  """Audio tokenizer settings or files that cannot be used (not an AudioError: --skip_bad skips those per file)."""


def load_audio(path: str, sample_rate: int, counts: collections.Counter | None = None) -> np.ndarray:
  """Mono float32 waveform at `sample_rate`. A file at another rate is resampled (librosa) and a multichannel one
  mixed down, each counted in `counts` (`resampled`, `mixed_down`) for the build report; a WAV whose header
  promises more samples than the file holds (a cut copy) is refused, as is an unreadable or empty one."""
  import os

  import soundfile

  if not os.path.exists(path):
    raise AudioError(f"audio file {path} does not exist")
  if os.path.getsize(path) == 0:
    raise AudioError(f"audio file {path} is empty (0 bytes)")
  _check_wav_length(path)
  try:
    info = soundfile.info(path)
    wave, rate = soundfile.read(path, dtype="float32", always_2d=True)
  except Exception:  # not a format libsndfile reads: librosa's other backends may
    info = None
    try:
      import warnings

      import librosa

      with warnings.catch_warnings():  # librosa's "PySoundFile failed" notes: the error below says it all
        warnings.simplefilter("ignore")
        wave, rate = librosa.load(path, sr=None, mono=False)
      wave = np.atleast_2d(wave).T
    except Exception as e:  # soundfile/audioread raise many types for corrupt files
      raise AudioError(f"audio file {path} cannot be read ({type(e).__name__}: {e})") from e
  if wave.size == 0:
    raise AudioError(f"audio file {path} holds no samples")
  if info is not None and len(wave) < info.frames:
    raise AudioError(f"audio file {path} is cut: its header promises {info.frames} samples, it holds {len(wave)}")
  if wave.shape[1] > 1:
    wave = wave.mean(axis=1, keepdims=True)
    if counts is not None:
      counts["mixed_down"] += 1
  wave = wave[:, 0]
  if rate != sample_rate:
    import librosa

    wave = librosa.resample(wave, orig_sr=rate, target_sr=sample_rate)
    if counts is not None:
      counts["resampled"] += 1
  return np.ascontiguousarray(wave, dtype=np.float32)


def _check_wav_length(path: str) -> None:
  """A RIFF/WAVE file whose `data` chunk declares more bytes than follow it is a cut copy (libsndfile would read
  the part that is there without a word). Streaming writers' placeholder sizes (0, 0xFFFFFFFF) are let through."""
  import os
  import struct

  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
      return
    while True:
      chunk = f.read(8)
      if len(chunk) < 8:
        return
      name, length = chunk[:4], struct.unpack("<I", chunk[4:])[0]
      if name == b"data":
        held = size - f.tell()
        if length not in (0, 0xFFFFFFFF) and length > held:
          raise AudioError(f"audio file {path} is cut: its header promises {length} bytes of samples, "
                           f"the file holds {held}")
        return
      f.seek(length + (length & 1), 1)


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

  def encode_batch(self, waves: list[np.ndarray], names: list[str] | None = None, progress=None) -> list[np.ndarray]:
    """Codes of each wave; JAX tokenizers batch them (tasks/audio/jax_tokenizer.py), others go one by one.
    `progress`: a progress line's name, or a `s2sjax.progress.Progress` a longer job counts on."""
    meter = (Progress(len(waves), progress, unit="utterances", rate_unit="audio s") if isinstance(progress, str)
             else progress)
    out = []
    for index, wave in enumerate(waves):
      out.append(self.encode(wave, names[index] if names else str(index)))
      if meter:
        meter.update(1, len(wave) / self.sample_rate)
    return out

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
