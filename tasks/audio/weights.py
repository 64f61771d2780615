"""Tensors of an audio tokenizer's release files, read without torch, each checked against the shape its model
needs: a missing tensor or a wrong shape is an error naming the file and the key, as the checkpoint converter's."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from s2sjax.runtime.errors import UserError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class WeightsError(UserError, ValueError):
  """A release file that cannot serve its model: absent, unreadable, a tensor missing or of the wrong shape."""


def read_json(path: str, error: type[ValueError] = WeightsError) -> dict:
  """A release's JSON file (config.json and the like), or `error` naming it: absent, unreadable, not JSON."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise error(f"{path} cannot be read as JSON ({e})") from e


def _files(path: str) -> dict[str, str]:
  """key -> the safetensors file holding it, for a file, a folder's model.safetensors or a sharded folder."""
  from safetensors import safe_open

  if os.path.isdir(path):
    if os.path.exists(os.path.join(path, INDEX)):
      try:
        with open(os.path.join(path, INDEX)) as f:
          weight_map = json.load(f)["weight_map"]
      except (OSError, ValueError, KeyError) as e:
        raise WeightsError(f"{os.path.join(path, INDEX)} cannot be read as a safetensors index ({e})") from e
      return {key: os.path.join(path, name) for key, name in weight_map.items()}
    if not os.path.exists(os.path.join(path, SINGLE)):
      raise WeightsError(f"{path} holds neither {SINGLE} nor {INDEX}")
    path = os.path.join(path, SINGLE)
  if not os.path.exists(path):
    raise WeightsError(f"weights file {path} does not exist")
  try:
    with safe_open(path, framework="np") as f:
      return {key: path for key in f.keys()}
  except Exception as e:  # safetensors raises its own error types for a cut or foreign file
    raise WeightsError(f"{path} cannot be read as safetensors ({type(e).__name__}: {e})") from e


class ReleaseWeights:
  """The tensors under `prefix` of a release's safetensors (`audio_tokenizer.` of a Baichuan-Audio folder, say).

  `take` reads one tensor as float32 and checks its shape; `fingerprint` hashes what was taken, so the build
  record changes when a weight does."""

  def __init__(self, path: str, prefix: str = ""):
    self.path, self.prefix = path, prefix
    self._where = {key[len(prefix):]: file for key, file in _files(path).items() if key.startswith(prefix)}
    if not self._where:
      raise WeightsError(f"{path} holds no tensor whose key starts with {prefix!r}")
    self._digest = hashlib.sha256()

  def keys(self) -> list[str]:
    return sorted(self._where)

  def has(self, key: str) -> bool:
    return key in self._where

  def take(self, key: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The tensor `prefix + key` as float32, refused when absent or when its shape is not `shape`."""
    from safetensors import safe_open

    if key not in self._where:
      raise WeightsError(f"{self.path}: tensor {self.prefix + key!r} is missing")
    with safe_open(self._where[key], framework="np") as f:
      # numpy has no bfloat16: such a tensor (a release kept in bf16, Step-Audio 2's) is read through jax
      framework = "flax" if f.get_slice(self.prefix + key).get_dtype() == "BF16" else "np"
    with safe_open(self._where[key], framework=framework) as f:
      try:
        array = f.get_tensor(self.prefix + key)
      except Exception as e:  # a dtype numpy cannot hold (bf16) or a cut file
        raise WeightsError(f"{self._where[key]}: tensor {self.prefix + key!r} cannot be read ({e})") from e
    if shape is not None and tuple(array.shape) != tuple(shape):
      raise WeightsError(f"{self._where[key]}: tensor {self.prefix + key!r} has shape {tuple(array.shape)}, "
                         f"the model needs {tuple(shape)}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    self._digest.update(key.encode() + b"\0" + array.tobytes())
    return array

  def fingerprint(self) -> str:
    """A hash of every tensor taken so far, with its key."""
    return self._digest.hexdigest()[:16]
