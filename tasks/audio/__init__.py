"""Audio tokenizers: waveform -> integer codes [frames, codebooks], run once when a dataset is built."""

from __future__ import annotations

import os

from tasks.audio.base import AudioTokenizer

TYPES = ("precomputed", "mel_kmeans", "hubert_kmeans", "mimi")


def from_spec(settings: dict, codebook_sizes: tuple[int, ...], tokenizer_dir: str | None = None) -> AudioTokenizer:
  """The spec's `audio_tokenizer` settings made concrete. Relative paths are read under `tokenizer_dir`
  (--audio_tokenizer_dir); for `precomputed` that directory holds the `<uttid>.npy` files."""
  kind = settings.get("type")
  where = lambda path: path if os.path.isabs(path) or tokenizer_dir is None else os.path.join(tokenizer_dir, path)
  if kind == "mel_kmeans":
    from tasks.audio.mel_kmeans import MelKmeansTokenizer
    from tasks.sample import MEL_KMEANS_CODEBOOK

    codebook = settings.get("codebook", "bundled")
    tokenizer = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK if codebook == "bundled" else where(codebook),
                                   settings.get("dedup", False))
  elif kind == "precomputed":
    from tasks.audio.precomputed import PrecomputedTokenizer

    if tokenizer_dir is None:
      raise ValueError("precomputed audio codes need --audio_tokenizer_dir (a directory of <uttid>.npy files)")
    tokenizer = PrecomputedTokenizer(tokenizer_dir, codebook_sizes)
  elif kind == "hubert_kmeans":
    from tasks.audio.neural import HubertKmeansTokenizer

    tokenizer = HubertKmeansTokenizer(where(settings["model_dir"]), where(settings["centroids"]),
                                      int(settings["layer"]), settings.get("dedup", True))
  elif kind == "mimi":
    from tasks.audio.neural import MimiTokenizer

    tokenizer = MimiTokenizer(where(settings["model_dir"]), int(settings.get("codebooks", 8)))
  else:
    raise ValueError(f"unknown audio tokenizer type {kind!r}; types: {', '.join(TYPES)}")
  if tuple(tokenizer.codebook_sizes) != tuple(codebook_sizes):
    raise ValueError(f"the {kind} tokenizer makes codebooks {tokenizer.codebook_sizes}, the spec says {codebook_sizes}")
  return tokenizer
