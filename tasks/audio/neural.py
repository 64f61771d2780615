"""Tokenizers built on transformers models loaded from a local directory (never a hub): HuBERT + k-means units
(TWIST, SIMS) and Mimi codec codes (Moshi)."""

from __future__ import annotations

import os

import numpy as np

from tasks.audio.base import AudioTokenizer, dedup, hash_array


def _weights_hash(model) -> str:
  import hashlib

  digest = hashlib.sha256()
  for name, tensor in sorted(model.state_dict().items()):
    digest.update(name.encode())
    digest.update(tensor.detach().float().numpy().tobytes())
  return digest.hexdigest()[:16]


class HubertKmeansTokenizer(AudioTokenizer):
  """Features of one HuBERT layer, assigned to the nearest of the given centroids [units, hidden]."""

  sample_rate = 16000
  num_codebooks = 1

  def __init__(self, model_dir: str, centroids_path: str, layer: int, deduplicate: bool = True):
    from transformers import HubertModel

    if not os.path.isdir(model_dir):
      raise FileNotFoundError(f"HuBERT model directory {model_dir} does not exist")
    self.model = HubertModel.from_pretrained(model_dir).eval()
    self.centroids = np.load(centroids_path).astype(np.float32)
    hidden = self.model.config.hidden_size
    if self.centroids.ndim != 2 or self.centroids.shape[1] != hidden:
      raise ValueError(f"{centroids_path}: centroids must be [units, {hidden}], got {self.centroids.shape}")
    if not 0 <= layer <= self.model.config.num_hidden_layers:
      raise ValueError(f"layer {layer} is outside HuBERT's 0..{self.model.config.num_hidden_layers}")
    self.layer, self.deduplicate = layer, deduplicate
    self.codebook_sizes = (len(self.centroids),)
    self._identity = {"type": "hubert_kmeans", "layer": layer, "dedup": deduplicate, "units": len(self.centroids),
                      "centroids_sha": hash_array(self.centroids), "weights_sha": _weights_hash(self.model)}

  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    import torch

    with torch.no_grad():
      out = self.model(torch.from_numpy(wave)[None], output_hidden_states=True)
    features = out.hidden_states[self.layer][0].numpy()
    distances = (features**2).sum(-1)[:, None] - 2 * features @ self.centroids.T + (self.centroids**2).sum(-1)[None]
    codes = distances.argmin(-1)[:, None].astype(np.int32)
    return dedup(codes) if self.deduplicate else codes

  def identity(self) -> dict:
    return self._identity


class MimiTokenizer(AudioTokenizer):
  """Mimi's residual-VQ codes, the first `num_codebooks` quantizers, at 12.5 frames per second."""

  def __init__(self, model_dir: str, num_codebooks: int = 8):
    from transformers import MimiModel

    if not os.path.isdir(model_dir):
      raise FileNotFoundError(f"Mimi model directory {model_dir} does not exist")
    self.model = MimiModel.from_pretrained(model_dir).eval()
    if not 0 < num_codebooks <= self.model.config.num_quantizers:
      raise ValueError(f"num_codebooks {num_codebooks} is outside Mimi's 1..{self.model.config.num_quantizers}")
    self.sample_rate = self.model.config.sampling_rate
    self.num_codebooks = num_codebooks
    self.codebook_sizes = (self.model.config.codebook_size,) * num_codebooks
    self._identity = {"type": "mimi", "codebooks": num_codebooks, "weights_sha": _weights_hash(self.model)}

  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    import torch

    with torch.no_grad():
      codes = self.model.encode(torch.from_numpy(wave)[None, None], num_quantizers=self.num_codebooks).audio_codes
    return codes[0].T.numpy().astype(np.int32)  # [frames, codebooks]

  def identity(self) -> dict:
    return self._identity
