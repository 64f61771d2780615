"""The on-disk model format: an orbax parameter tree plus the JSON that says what it is.

    DIR/model_config.json   ModelConfig (architecture, audio input tables)
    DIR/params/             orbax PyTree: `abstract_params(config)` with the stacked `layers` subtree stored one
                            layer at a time (`layers/<i>/...`), restacked on load
    DIR/extras/             orbax PyTree of tensors kept from the source but not used by the decoder (audio heads)
    DIR/tokenizer/          the tokenizer files, when the source had them
    DIR/manifest.json       provenance (source, dtype, kept and skipped keys); written last

Leaves are written one at a time (orbax partial saves) and layers unstacked, so writing needs memory for about
one layer's largest tensor, not the model.
Everything goes to a temporary sibling directory that is renamed into place only when complete: a directory
without `manifest.json` was never finished.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import uuid
from typing import Any, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from s2sjax import sharding
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Params, abstract_params, param_logical_axes

MANIFEST = "manifest.json"
LeafPath = tuple[str, ...]


class CheckpointError(ValueError):
  """A checkpoint directory that is missing, unfinished or does not fit its config."""


def _release_freed_memory() -> None:
  # glibc keeps freed leaf buffers in its arenas; hand them back so peak RSS tracks one leaf.
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except OSError:
    pass


def _nest(path: LeafPath, value: Any) -> dict:
  for key in reversed(path):
    value = {key: value}
  return value


def _save_leaves(
  directory: epath.Path, leaves: Iterable[tuple[LeafPath, np.ndarray]], batch_bytes: int = 256 << 20
) -> dict[LeafPath, tuple]:
  """Saves leaves as they come, in partial saves of about `batch_bytes` (each save has a fixed cost, each byte
  held costs memory); returns {path: shape} of what was written."""
  from orbax.checkpoint.experimental.v1 import partial

  written: dict[LeafPath, tuple] = {}
  batch: dict = {}
  held = 0
  for path, array in leaves:
    array = np.asarray(array)
    _merge(batch, _nest(path, array))
    written[path] = array.shape
    held += array.nbytes
    del array
    if held >= batch_bytes:
      partial.save(directory, batch)
      batch, held = {}, 0
      _release_freed_memory()
  if batch:
    partial.save(directory, batch)
  if written:
    partial.finalize(directory)
  return written


def disk_layout(abstract: Params) -> dict[LeafPath, jax.ShapeDtypeStruct]:
  """Stored leaves: every stacked `layers/...` leaf [n, ...] becomes n leaves `layers/<i>/...`."""
  out = {}
  for path, leaf in flatten(abstract):
    if path[0] == "layers":
      for i in range(leaf.shape[0]):
        out[("layers", str(i)) + path[1:]] = jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)
    else:
      out[path] = leaf
  return out


def _check_shapes(expected: Mapping[LeafPath, tuple], given: Mapping[LeafPath, tuple]) -> None:
  """Raises CheckpointError naming every missing, unexpected or mis-shaped key."""
  problems = [f"missing {'/'.join(p)}" for p in sorted(expected.keys() - given.keys())]
  problems += [f"unexpected {'/'.join(p)}" for p in sorted(given.keys() - expected.keys())]
  problems += [
    f"{'/'.join(p)}: shape {given[p]}, config implies {expected[p]}"
    for p in sorted(expected.keys() & given.keys())
    if tuple(given[p]) != tuple(expected[p])
  ]
  if problems:
    raise CheckpointError("parameters do not fit the config:\n  " + "\n  ".join(problems))


def write_checkpoint(
  out_dir: str | epath.Path,
  config: ModelConfig,
  leaves: Iterable[tuple[LeafPath, np.ndarray]],
  *,
  extras: Iterable[tuple[LeafPath, np.ndarray]] = (),
  tokenizer_dir: str | epath.Path | None = None,
  manifest: Mapping[str, Any] | None = None,
  overwrite: bool = False,
) -> epath.Path:
  """Writes a checkpoint from lazily produced (path, array) leaves; returns its directory."""
  out_dir = epath.Path(out_dir)
  if out_dir.exists() and not overwrite:
    raise CheckpointError(f"{out_dir} already exists (pass overwrite=True / --overwrite to replace it)")
  staging = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"
  staging.mkdir(parents=True)
  try:
    (staging / "model_config.json").write_text(config.to_json())
    written = _save_leaves(staging / "params", leaves)
    expected = {path: leaf.shape for path, leaf in disk_layout(abstract_params(config)).items()}
    _check_shapes(expected, written)
    _save_leaves(staging / "extras", extras)
    if tokenizer_dir is not None:
      shutil.copytree(str(tokenizer_dir), str(staging / "tokenizer"))
    (staging / MANIFEST).write_text(json.dumps(dict(manifest or {}), indent=2, sort_keys=True, default=str))
    if out_dir.exists():
      shutil.rmtree(str(out_dir))
    staging.rename(out_dir)
  except BaseException:
    shutil.rmtree(str(staging), ignore_errors=True)
    raise
  return out_dir


def flatten(tree: Mapping[str, Any], prefix: LeafPath = ()) -> list[tuple[LeafPath, Any]]:
  """Nested dict -> [(key path, leaf)] in sorted key order."""
  items = []
  for key in sorted(tree):
    value = tree[key]
    items.extend(flatten(value, prefix + (key,)) if isinstance(value, Mapping) else [(prefix + (key,), value)])
  return items


def save_params(out_dir, config: ModelConfig, params: Params, **kwargs) -> epath.Path:
  """Saves an in-memory parameter tree (e.g. from a JAX training run) after checking it against the config."""
  check_params(config, params)
  return write_checkpoint(out_dir, config, _unstacked(params), **kwargs)


def _unstacked(params: Params) -> Iterator[tuple[LeafPath, np.ndarray]]:
  for path, leaf in flatten(params):
    if path[0] == "layers":
      for i in range(leaf.shape[0]):
        yield ("layers", str(i)) + path[1:], np.asarray(jax.device_get(leaf[i]))
    else:
      yield path, np.asarray(jax.device_get(leaf))


def check_params(config: ModelConfig, params: Params) -> None:
  """Raises CheckpointError naming every missing, unexpected or mis-shaped key of an in-memory tree."""
  expected = {path: leaf.shape for path, leaf in flatten(abstract_params(config))}
  _check_shapes(expected, {path: tuple(np.shape(leaf)) for path, leaf in flatten(params)})


def _require_finished(ckpt_dir: epath.Path) -> None:
  if not (ckpt_dir / MANIFEST).exists():
    if ckpt_dir.exists():
      raise CheckpointError(f"{ckpt_dir} is not a finished s2sjax checkpoint (no {MANIFEST})")
    raise CheckpointError(f"checkpoint {ckpt_dir} does not exist")


def load_config(ckpt_dir: str | epath.Path) -> ModelConfig:
  ckpt_dir = epath.Path(ckpt_dir)
  _require_finished(ckpt_dir)
  return ModelConfig.from_json((ckpt_dir / "model_config.json").read_text())


def load_manifest(ckpt_dir: str | epath.Path) -> dict:
  ckpt_dir = epath.Path(ckpt_dir)
  _require_finished(ckpt_dir)
  return json.loads((ckpt_dir / MANIFEST).read_text())


def load_params(ckpt_dir: str | epath.Path, mesh: Mesh | None = None, dtype=None) -> Params:
  """Restores the parameters onto `mesh` (default: every device, data-parallel), sharded by the logical rules,
  optionally cast to `dtype`. Works for any device count, whatever the one the checkpoint was written with."""
  from orbax.checkpoint.experimental import v1 as ocp

  ckpt_dir = epath.Path(ckpt_dir)
  config = load_config(ckpt_dir)
  mesh = mesh or sharding.make_mesh()
  abstract = abstract_params(config)
  shardings = dict(flatten(sharding.logical_to_sharding(param_logical_axes(config), abstract, mesh)))
  saved = dict(flatten(ocp.metadata(ckpt_dir / "params").metadata))
  stored = disk_layout(abstract)
  mismatched = sorted(set(saved) ^ set(stored))
  if mismatched:
    raise CheckpointError(f"{ckpt_dir}/params does not match model_config.json at keys: {mismatched[:10]}")

  def layer_sharding(path: LeafPath):
    whole = shardings[("layers",) + path[2:] if path[0] == "layers" else path]
    return whole if path[0] != "layers" else NamedSharding(mesh, PartitionSpec(*whole.spec[1:]))

  target = {}
  for path, leaf in stored.items():
    leaf_dtype = jnp.dtype(dtype) if dtype is not None else saved[path].dtype
    _merge(target, _nest(path, jax.ShapeDtypeStruct(leaf.shape, leaf_dtype, sharding=layer_sharding(path))))
  restored = ocp.load(ckpt_dir / "params", target)
  per_layer = restored.pop("layers")
  layers = {}
  for path, _ in flatten(abstract["layers"]):
    slices = [dict(flatten(per_layer[str(i)]))[path] for i in range(config.num_layers)]
    stack = jax.jit(lambda *xs: jnp.stack(xs), out_shardings=shardings[("layers",) + path])
    _merge(layers, _nest(path, stack(*slices)))
  restored["layers"] = layers
  return restored


def load_extras(ckpt_dir: str | epath.Path) -> dict[str, np.ndarray]:
  from orbax.checkpoint.experimental import v1 as ocp

  path = epath.Path(ckpt_dir) / "extras"
  return ocp.load(path) if path.exists() else {}


def _merge(tree: dict, other: dict) -> dict:
  for key, value in other.items():
    tree[key] = _merge(tree.get(key, {}), value) if isinstance(value, dict) else value
  return tree
