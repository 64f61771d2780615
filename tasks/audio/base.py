"""The interface every audio tokenizer implements, and audio loading."""

from __future__ import annotations

import abc
import collections
import hashlib

import numpy as np

from s2sjax.runtime.errors import UserError
from s2sjax.runtime.progress import Progress


class AudioError(UserError, ValueError):
  """Audio that cannot be used: missing, unreadable, empty. Names the file."""


class AudioTokenizerError(UserError, ValueError):
  """Audio tokenizer settings or files that cannot be used (not an AudioError: --skip_bad skips those per file)."""


# What a recording may claim and hold (`check_recording`). Rates: 4 kHz is below any speech codec's (telephony is
# 8 kHz), 384 kHz the highest a recorder writes; a header outside them is damaged, and trusting it would resample
# seconds into hours (1 Hz) or into nothing (2 GHz). Samples: a float recording's full scale is ±1; past ±2 (6 dB
# over) it was scaled wrong (int16 values written as floats reach ±32768), and a tokenizer would hear noise.
SAMPLE_RATES_HZ = (4_000, 384_000)
PEAK_LIMIT = 2.0


def load_audio(path: str, sample_rate: int, counts: collections.Counter | None = None) -> np.ndarray:
  """Mono float32 waveform at `sample_rate`. A file at another rate is resampled (librosa) and a multichannel one
  mixed down, each counted in `counts` (`resampled`, `resampled <from>-><to>`, `mixed_down`) for the build report.
  A file that `check_recording` refuses (cut, empty, a rate no recording has, non-finite or far out-of-range
  samples), or that cannot be read, is an AudioError naming it."""
  import os

  import soundfile

  if not os.path.exists(path):
    raise AudioError(f"audio file {path} does not exist")
  if not os.path.isfile(path):  # a folder, a FIFO (reading it would block), a device (it would never end)
    raise AudioError(f"audio file {path} is not a regular file")
  if os.path.getsize(path) == 0:
    raise AudioError(f"audio file {path} is empty (0 bytes)")
  _check_wav_length(path)
  try:
    declared = soundfile.info(path).frames
    wave, rate = soundfile.read(path, dtype="float32", always_2d=True)
  except Exception:  # not a format libsndfile reads: librosa's other backends may
    declared = None
    try:
      import warnings

      import librosa

      with warnings.catch_warnings():  # librosa's "PySoundFile failed" notes: the error below says it all
        warnings.simplefilter("ignore")
        wave, rate = librosa.load(path, sr=None, mono=False)
      wave = np.atleast_2d(wave).T
    except Exception as e:  # soundfile/audioread raise many types for corrupt files
      raise AudioError(f"audio file {path} cannot be read ({type(e).__name__}: {e})") from e
  check_recording(path, wave, rate, declared)
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
      counts[f"{RESAMPLED}{rate}->{sample_rate}"] += 1
  return np.ascontiguousarray(wave, dtype=np.float32)


def check_recording(path: str, wave: np.ndarray, rate: float, declared_frames: int | None = None) -> None:
  """The one check of what a decoded recording claims (its rate, its length) against what it holds: samples, all
  finite, within ±PEAK_LIMIT, at a rate within SAMPLE_RATES_HZ, as many as the header promised. Raises an
  AudioError naming the file and the figure."""
  low, high = SAMPLE_RATES_HZ
  if not low <= rate <= high:
    raise AudioError(f"audio file {path} claims a sample rate of {rate:,} Hz: no recording has one outside "
                     f"{low:,}-{high:,} Hz (a damaged header?)")
  if wave.size == 0:
    raise AudioError(f"audio file {path} holds no samples")
  if declared_frames is not None and len(wave) < declared_frames:
    raise AudioError(f"audio file {path} is cut: its header promises {declared_frames} samples, it holds "
                     f"{len(wave)}")
  finite = np.isfinite(wave)
  if not finite.all():
    first = int(np.flatnonzero(~finite.all(axis=1))[0])
    raise AudioError(f"audio file {path} holds non-finite samples (NaN or ±Inf): {int((~finite).sum()):,}, the first "
                     f"at {first / rate:.3f} s")
  peak = float(np.abs(wave).max())
  if peak > PEAK_LIMIT:
    raise AudioError(f"audio file {path} peaks at {peak:.4g}, far outside full scale ±1 (past ±{PEAK_LIMIT:g}: "
                     "scaled wrong, e.g. integer samples written as floats)")


RESAMPLED = "resampled "  # a `counts` key's prefix: "resampled 22050->16000"


def resamplings(counts: collections.Counter | dict) -> dict[str, int]:
  """How many files were resampled from which rate to which, `{"22050->16000": 3}`, from load_audio's counts."""
  return {key[len(RESAMPLED):]: n for key, n in sorted(counts.items()) if key.startswith(RESAMPLED)}


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
  """waveform [samples] at `sample_rate` -> int32 codes [frames, num_codebooks]; a tokenizer with a feature track
  (`feature_width` > 0) also gives each code frame a float vector (`frame_features`)."""

  sample_rate: int
  num_codebooks: int
  codebook_sizes: tuple[int, ...]
  reads_audio: bool = True  # False: codes come from elsewhere by uttid, the wav is not decoded
  feature_width: int = 0  # > 0: a float32 feature vector of this width beside each code frame

  @abc.abstractmethod
  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    """Codes of one utterance; `uttid` names it (precomputed tokenizers look it up by name)."""

  def encode_batch(self, waves: list[np.ndarray], names: list[str] | None = None, progress=None) -> list[np.ndarray]:
    """Codes of each wave; JAX tokenizers batch them (tasks/audio/jax_tokenizer.py), others go one by one.
    `progress`: a progress line's name, or a `s2sjax.runtime.progress.Progress` a longer job counts on."""
    meter = (Progress(len(waves), progress, unit="utterances", rate_unit="audio s") if isinstance(progress, str)
             else progress)
    out = []
    for index, wave in enumerate(waves):
      out.append(self.encode(wave, names[index] if names else str(index)))
      if meter:
        meter.update(1, len(wave) / self.sample_rate)
    return out

  def frame_features(self, waves: list[np.ndarray], progress=None) -> list[np.ndarray]:
    """float32 [frames, feature_width] per wave, row t beside code frame t of `encode_batch`'s codes: the float
    track a model reads with the codes (Kimi-Audio's Whisper features). Only where `feature_width` > 0."""
    raise AudioTokenizerError(f"the {type(self).__name__} audio tokenizer has no feature track")

  @abc.abstractmethod
  def identity(self) -> dict:
    """What determines the codes (type, settings, weights): recorded with the dataset."""

  def fingerprint(self) -> str:
    """A short hash of `identity()` and the weights behind it: `tasks.prepare` refuses to reuse data built with
    another tokenizer (the fingerprint is part of the built data's `inputs`)."""
    return hashlib.sha256(repr(sorted(self.identity().items())).encode()).hexdigest()[:16]


MAX_FILE_BYTES = 4 * 2**30  # RIFF's own limit (32-bit sizes): no one question's recording or codes is larger


def folder_digest(directory: str, suffix: str) -> str:
  """A hash of the names and bytes of every `*suffix` file in `directory`: contents, not times, so a copied folder
  hashes the same and a file rewritten in place does not. Only regular files are read (a FIFO would block, a
  device never end): any other entry, or one that cannot be opened, counts by its name and kind and is named in a
  warning; a file past MAX_FILE_BYTES is refused by name."""
  import os

  from absl import logging

  digest, others = hashlib.sha256(), []
  for name in sorted(n for n in os.listdir(directory) if n.endswith(suffix)):
    digest.update(name.encode() + b"\0")
    path = os.path.join(directory, name)
    file, kind = _open_regular(path)
    if file is None:
      digest.update(f"<{kind}>".encode())
      others.append(f"{name} ({kind})")
      continue
    with file:
      if os.fstat(file.fileno()).st_size > MAX_FILE_BYTES:
        raise AudioError(f"{path} is over {MAX_FILE_BYTES // 2**30} GiB: no one recording's or codes file is; move "
                         "it out of the folder")
      for block in iter(lambda: file.read(1 << 20), b""):
        digest.update(block)
  if others:
    logging.warning("%s: left out of the fingerprint, as no recording or codes file: %s", directory, ", ".join(others))
  return digest.hexdigest()[:16]


def _open_regular(path: str):
  """(the file opened for reading, None) if `path` is a regular file, else (None, what it is). Opened without
  blocking, so a FIFO is seen for what it is instead of waiting for a writer."""
  import os
  import stat

  try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
  except OSError as e:  # a dangling link, a socket, no permission: a question that reads it names it there
    return None, e.strerror.lower()
  mode = os.fstat(fd).st_mode
  if stat.S_ISREG(mode):
    return os.fdopen(fd, "rb"), None
  os.close(fd)
  return None, "a folder" if stat.S_ISDIR(mode) else "not a regular file"


def hash_array(array: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]
