"""Codes computed elsewhere (Baichuan-Audio's or GLM-4-Voice's own tokenizer): `<uttid>.npy` per spoken prefix,
and `candidates/<name>.npy` per spoken candidate (`name` as its wav in the release: `<uttid>`, `<uttid>_A`)."""

from __future__ import annotations

import os

import numpy as np

from s2sjax.runtime.errors import MissingFileError
from tasks.audio.base import AudioError, AudioTokenizer, AudioTokenizerError, folder_digest


CANDIDATES = "candidates"


class PrecomputedTokenizer(AudioTokenizer):
  sample_rate = 16000  # unused: codes are read, not computed
  reads_audio = False

  def __init__(self, codes_dir: str, codebook_sizes: tuple[int, ...]):
    if not os.path.isdir(codes_dir):
      raise MissingFileError(f"precomputed codes directory {codes_dir} does not exist")
    self.codes_dir = codes_dir
    self.codebook_sizes = tuple(codebook_sizes)
    self.num_codebooks = len(self.codebook_sizes)
    self._identity: dict | None = None

  @classmethod
  def from_settings(cls, settings: dict, where) -> "PrecomputedTokenizer":
    """The codes folder is --audio_tokenizer_dir itself (or the spec's `codes_dir` under it)."""
    if "codebook_sizes" not in settings:
      raise AudioTokenizerError("precomputed codes are read, not made: their codebook sizes come from a spec")
    return cls(where(settings.get("codes_dir")), tuple(settings["codebook_sizes"]))

  def encode(self, wave: np.ndarray | None, uttid: str) -> np.ndarray:
    path = os.path.join(self.codes_dir, f"{uttid}.npy")
    if not os.path.exists(path):
      raise AudioError(f"uttid {uttid}: precomputed codes {path} do not exist")
    return read_codes(path, self.codebook_sizes, f"uttid {uttid}: ")

  def identity(self) -> dict:
    """Hashes every code file's name and bytes: codes rewritten in place under the same names change it too."""
    if self._identity is None:
      files = sum(n.endswith(".npy") for n in os.listdir(self.codes_dir))
      self._identity = {"type": "precomputed", "codebook_sizes": list(self.codebook_sizes), "files": files,
                        "codes_sha": folder_digest(self.codes_dir, ".npy")}
      candidates = os.path.join(self.codes_dir, CANDIDATES)
      if os.path.isdir(candidates):
        self._identity["candidate_codes_sha"] = folder_digest(candidates, ".npy")
    return self._identity


def read_codes(path: str, codebook_sizes: tuple[int, ...], where: str = "") -> np.ndarray:
  """int32 codes [frames, codebooks] from a `.npy` ([frames] for one codebook), or an AudioError naming the file
  (after `where`): the array must be non-empty, of integers (integral floats are read as the integers they hold;
  fractions, NaN and booleans are not codes), each within its codebook's size."""
  try:
    codes = np.load(path)  # pickles are refused (allow_pickle=False): a codes file runs no code
  except (OSError, ValueError, EOFError) as e:
    raise AudioError(f"{where}{path} is not a .npy array ({e})") from e
  if not isinstance(codes, np.ndarray):  # an .npz archive
    raise AudioError(f"{where}{path} is not one .npy array")
  if codes.ndim == 1:
    codes = codes[:, None]
  if codes.ndim != 2 or codes.shape[1] != len(codebook_sizes) or len(codes) == 0:
    raise AudioError(f"{where}{path} must be [frames, {len(codebook_sizes)}], got {codes.shape}")
  if codes.dtype.kind == "f":
    integral = np.isfinite(codes) & (codes == np.round(codes))
    if not integral.all():
      frame, book = np.argwhere(~integral)[0]
      raise AudioError(f"{where}{path} holds {codes.dtype} values that are no codes (frame {frame}, codebook "
                       f"{book}: {codes[frame, book]}): codes are integers")
  elif codes.dtype.kind not in "iu":
    raise AudioError(f"{where}{path} holds {codes.dtype} values: codes are integers")
  outside = (codes < 0) | (codes >= np.asarray(codebook_sizes))
  if outside.any():
    frame, book = np.argwhere(outside)[0]
    raise AudioError(f"{where}{path} holds codes outside the codebook sizes {tuple(codebook_sizes)} (frame {frame}, "
                     f"codebook {book}: {codes[frame, book]})")
  return codes.astype(np.int32)
