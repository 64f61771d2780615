"""Lazy readers for the checkpoint formats users bring: HF safetensors (sharded or not), `pytorch_model*.bin`,
and GGUF (of the families that declare how llama.cpp writes them). Every reader presents the same face: a Hugging
Face `config.json` dict, key names in Hugging Face spelling, shapes without reading data, and one tensor at a time
on `read`.

A folder whose model wraps a transformers causal LM (SlamKit's `UnitLM`) is presented as the LM inside: its config
and its keys without the wrapper's prefix (`WRAPPERS`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import zipfile
from typing import Protocol

import numpy as np

from checkpoints_conversion import safetensors_io
from s2sjax.model import families
from s2sjax.runtime.errors import UserError
from s2sjax.model.config import ConfigError
from s2sjax.runtime.registry import Registry


class SourceError(UserError, ValueError):
  """A checkpoint that cannot be read: missing files, corrupt headers, unsupported variants."""


class TensorSource(Protocol):
  description: str
  config: dict

  def keys(self) -> list[str]: ...

  def shape(self, key: str) -> tuple[int, ...]: ...

  def read(self, key: str) -> np.ndarray: ...


def _read_config(directory: str) -> dict:
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise SourceError(f"{directory} has no config.json")
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise SourceError(f"{path} is not JSON ({e})") from e
  if not isinstance(config, dict):
    raise SourceError(f"{path} holds a JSON {type(config).__name__}, not an object of settings")
  return config


def _indexed_files(directory: str, index_name: str, pattern: str) -> tuple[list[str], dict[str, str] | None]:
  """Files of a (possibly sharded) checkpoint; with an index, every shard it names must exist."""
  index_path = os.path.join(directory, index_name)
  if os.path.exists(index_path):
    with open(index_path) as f:
      weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
    missing = [name for name in files if not os.path.exists(os.path.join(directory, name))]
    if missing:
      raise SourceError(f"{index_path} names shards that are missing: {missing}")
    return [os.path.join(directory, name) for name in files], weight_map
  return sorted(glob.glob(os.path.join(directory, pattern))), None


class SafetensorsSource:
  def __init__(self, directory: str):
    self.config = _read_config(directory)
    paths, weight_map = _indexed_files(directory, "model.safetensors.index.json", "*.safetensors")
    self.description = f"{directory} ({len(paths)} safetensors file(s))"
    self._where: dict[str, safetensors_io.SafetensorsFile] = {}
    # Every shard's header is checked before any tensor is read, and all problems are reported at once.
    problems, unreadable = [], set()
    for path in paths:
      try:
        shard = safetensors_io.SafetensorsFile(path)
      except ValueError as e:
        problems += str(e).splitlines()  # one line per bad tensor
        unreadable.add(path)
        continue
      for key in shard.keys():
        if key in self._where:
          problems.append(f"tensor {key} appears in both {self._where[key].path} and {path}")
        else:
          self._where[key] = shard
    if weight_map is not None:
      listed = {key for key, name in weight_map.items() if os.path.join(directory, name) not in unreadable}
      unlisted = sorted(listed ^ set(self._where))
      if unlisted:
        problems.append(f"the index and the shards disagree about keys: {unlisted[:10]}")
    if problems:
      listing = "\n  ".join(problems)
      raise SourceError(f"{directory}: {len(problems)} problem(s) in its safetensors files:\n  {listing}")

  def keys(self) -> list[str]:
    return list(self._where)

  def shape(self, key: str) -> tuple[int, ...]:
    return self._where[key].shape(key)

  def read(self, key: str) -> np.ndarray:
    return self._where[key].read(key)


class TorchBinSource:
  """`pytorch_model*.bin` files through torch (the `convert` extra), with `weights_only` (a pickle runs no code):
  memory-mapped when zip-serialized (torch >= 1.6), read whole when in the legacy format torch maps not, as
  transformers reads them (`modeling_utils.load_state_dict`: mmap only if `is_zipfile`)."""

  def __init__(self, directory: str):
    import torch

    self.config = _read_config(directory)
    paths, _ = _indexed_files(directory, "pytorch_model.bin.index.json", "pytorch_model*.bin")
    self.description = f"{directory} ({len(paths)} pytorch .bin file(s))"
    self._tensors: dict = {}
    for path in paths:
      try:
        state = torch.load(path, map_location="cpu", mmap=zipfile.is_zipfile(path), weights_only=True)
      except Exception as e:  # torch raises several types for truncated or foreign files
        raise SourceError(f"{path}: cannot be read as a PyTorch state dict ({e})") from e
      self._tensors.update(state)

  def keys(self) -> list[str]:
    return list(self._tensors)

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(self._tensors[key].shape)

  def read(self, key: str) -> np.ndarray:
    import ml_dtypes
    import torch

    tensor = self._tensors[key]
    if tensor.dtype == torch.bfloat16:
      return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


class GgufSource:
  """A GGUF file, de-quantized tensor by tensor to fp32, under Hugging Face names and config.json keys.

  The file's `general.architecture` picks the family that reads it (`s2sjax.model.families.gguf_layout`): it names
  the tensors in HF spelling and undoes any reordering llama.cpp applied (llama's permuted q/k rows)."""

  def __init__(self, path: str):
    import gguf

    try:
      self._reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/struct errors/IndexError on foreign files
      raise SourceError(f"{path}: cannot be read as GGUF ({e})") from e
    self.path = path
    self.description = f"{path} (GGUF)"
    self._arch = self._field("general.architecture")
    try:
      self._layout = families.gguf_layout(self._arch)
    except ConfigError as e:
      raise SourceError(f"{path}: {e}") from e
    self._tensors = {self._layout.hf_key(t.name): t for t in self._reader.tensors}
    self.config = self._hf_config()

  def _field(self, name: str, default=None):
    field = self._reader.fields.get(name)
    return default if field is None else field.contents()

  def _number(self, key: str, kind=int, default=None):
    """`<architecture>.<key>` as a number of `kind` (`default` when absent, if given), or a SourceError naming it: a
    file whose general.architecture was relabelled holds its settings under another architecture's name."""
    name = f"{self._arch}.{key}"
    value = self._field(name)
    if value is None and default is not None:
      return default
    if value is None:
      found = sorted({n.split(".", 1)[0] for n in self._reader.fields if "." in n} - {"general", "tokenizer", "GGUF"})
      raise SourceError(f"{self.path}: GGUF general.architecture is {self._arch!r} but the file has no {name}"
                        + (f" (its settings are under {', '.join(found)}: relabelled?)" if found else ""))
    try:
      return kind(value)
    except (TypeError, ValueError):
      raise SourceError(f"{self.path}: GGUF {name}={value!r} is not a number") from None

  def _hf_config(self) -> dict:
    """llama.cpp's metadata (`<architecture>.<key>`) in transformers' config.json keys."""
    arch = self._arch
    if self._field(f"{arch}.rope.scaling.type", "none") not in ("none",):
      raise SourceError(f"{self.path}: scaled rope is not supported")
    tokens = self._field("tokenizer.ggml.tokens", [])
    heads, hidden = self._number("attention.head_count"), self._number("embedding_length")
    return {
      "model_type": self._layout.model_type,
      "hidden_size": hidden,
      "intermediate_size": self._number("feed_forward_length"),
      "num_hidden_layers": self._number("block_count"),
      "num_attention_heads": heads,
      "num_key_value_heads": self._number("attention.head_count_kv", default=heads),
      "head_dim": self._number("attention.key_length", default=hidden // heads if heads > 0 else 0),
      "rms_norm_eps": self._number("attention.layer_norm_rms_epsilon", float),
      "rope_theta": self._number("rope.freq_base", float, default=10000.0),
      "vocab_size": self._number("vocab_size", default=len(tokens)),
      "tie_word_embeddings": "lm_head.weight" not in self._tensors,
      "max_position_embeddings": self._number("context_length", default=2048),
      "attention_bias": False,
    }

  def keys(self) -> list[str]:
    return list(self._tensors)

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(self._tensors[key].shape))

  def read(self, key: str) -> np.ndarray:
    import gguf

    tensor = self._tensors[key]
    array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(self.shape(key))
    return self._layout.restore(key, array, self.config).astype(np.float32, copy=False)


@dataclasses.dataclass(frozen=True)
class Wrapper:
  """A model that holds a transformers causal LM as one of its modules, found by its config.json `model_type`."""

  model_type: str  # its config.json's, what it is registered and found by
  name: str
  inner_config: str  # the config.json key holding the LM's own config (with its model_type)
  prefix: str  # of the LM's tensor keys
  outer_keys: tuple[str, ...]  # config.json keys that override the LM's config: the wrapper changes them


# A plugin registers a wrapper of its own here, as families register in s2sjax.model.families.
WRAPPERS: Registry[Wrapper] = Registry("checkpoint wrapper", name_of=lambda wrapper: wrapper.model_type)
# SlamKit (github.com/slp-rl/slamkit, slamkit/model/unit_lm.py): UnitLMConfig's model_type (line 33) keeps the LM's
# config as `base_config` (lines 63-73); UnitLM keeps the LM as `self.lm` (line 94) and resizes its embeddings to
# UnitLMConfig's own vocab_size (line 102), so base_config's may still be the base model's.
WRAPPERS.register(Wrapper("speech_language_model", "SlamKit UnitLM", "base_config", "lm.", ("vocab_size",)))


class WrappedSource:
  """The LM inside a wrapper's checkpoint: its config with the wrapper's overrides, its keys without the prefix.
  Keys outside the prefix keep their names, so they surface as unexpected."""

  def __init__(self, outer: TensorSource, wrapper: Wrapper):
    inner = outer.config.get(wrapper.inner_config)
    if not isinstance(inner, dict) or "model_type" not in inner:
      raise SourceError(f"{outer.description}: a {wrapper.name} config.json (model_type "
                        f"{outer.config.get('model_type')!r}) needs `{wrapper.inner_config}` with its model_type")
    self.config = dict(inner, **{key: outer.config[key] for key in wrapper.outer_keys if key in outer.config})
    self.description = f"{outer.description}, the {inner['model_type']} LM of a {wrapper.name} under {wrapper.prefix!r}"
    self._outer = outer
    self._keys = {key.removeprefix(wrapper.prefix): key for key in outer.keys()}

  def keys(self) -> list[str]:
    return list(self._keys)

  def shape(self, key: str) -> tuple[int, ...]:
    return self._outer.shape(self._keys[key])

  def read(self, key: str) -> np.ndarray:
    return self._outer.read(self._keys[key])


def _unwrapped(source: TensorSource) -> TensorSource:
  model_type = source.config.get("model_type")
  return WrappedSource(source, WRAPPERS.get(model_type)) if model_type in WRAPPERS.names() else source


def open_source(path: str) -> TensorSource:
  """A GGUF file, or a directory of safetensors (preferred) or pytorch_model*.bin files with its config.json (read
  as the LM inside when the config.json is a wrapper's)."""
  if os.path.isfile(path):
    if path.endswith(".gguf"):
      return GgufSource(path)
    raise SourceError(f"{path}: a single file must be .gguf; for other formats pass the model directory")
  if not os.path.isdir(path):
    raise SourceError(f"checkpoint source {path} does not exist")
  if glob.glob(os.path.join(path, "*.safetensors")):
    return _unwrapped(SafetensorsSource(path))
  if glob.glob(os.path.join(path, "pytorch_model*.bin")):
    return _unwrapped(TorchBinSource(path))
  raise SourceError(f"{path} holds neither *.safetensors nor pytorch_model*.bin files")
