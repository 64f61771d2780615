"""Codes computed elsewhere (Baichuan-Audio's or GLM-4-Voice's own tokenizer): `<uttid>.npy` per spoken prefix,
and `candidates/<name>.npy` per spoken candidate (`name` as its wav in the release: `<uttid>`, `<uttid>_A`)."""

from __future__ import annotations

import os

import numpy as np

from s2sjax.errors import MissingFileError
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
    codes = np.load(path)
    if codes.ndim == 1:
      codes = codes[:, None]
    if codes.ndim != 2 or codes.shape[1] != self.num_codebooks or len(codes) == 0:
      raise AudioError(f"uttid {uttid}: {path} must be [frames, {self.num_codebooks}], got {codes.shape}")
    too_big = codes >= np.asarray(self.codebook_sizes)
    if too_big.any() or (codes < 0).any():
      raise AudioError(f"uttid {uttid}: {path} holds codes outside the codebook sizes {self.codebook_sizes}")
    return codes.astype(np.int32)

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
