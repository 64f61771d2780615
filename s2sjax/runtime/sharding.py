"""Meshes and the one table that maps logical axis names onto mesh axes.

Parameters and activations carry logical names (`vocab`, `embed`, `heads`, ...; see `model/decoder.py`); this
module alone decides which mesh axis each name lands on, so changing a parallelism layout is a one-line edit.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from s2sjax.runtime.errors import UserError


class MeshError(UserError, ValueError):
  """A --mesh that names no mesh of the devices there are, or one whose batch shards span processes."""


MESH_AXES = ("data", "fsdp", "model")

# logical name -> mesh axis (or None: replicated). Batch over data and fsdp; model-parallel dims over model;
# the embedding dim of parameters over fsdp (ZeRO-3-style), gathered by XLA where used.
LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
  ("batch", ("data", "fsdp")),
  ("length", None),
  ("vocab", "model"),
  ("audio_vocab", None),
  ("heads", "model"),
  ("kv_heads", "model"),
  ("mlp", "model"),
  ("embed", "fsdp"),
  ("head_dim", None),
  ("layers", None),
  ("norm", None),
  ("targets", None),
)


def parse_mesh_shape(spec: str, num_devices: int) -> dict[str, int]:
  """'data:-1,model:2' -> {'data': n/2, 'fsdp': 1, 'model': 2}; one axis may be -1 (all remaining devices)."""
  sizes = {axis: 1 for axis in MESH_AXES}
  free, named = None, set()
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, _, value = part.partition(":")
    if name not in MESH_AXES or not value.lstrip("-").isdigit():
      raise MeshError(f"bad mesh entry {part!r} in {spec!r}: expected AXIS:SIZE with AXIS in {MESH_AXES}")
    if name in named:  # the last would win without a word
      raise MeshError(f"mesh {spec!r} names axis {name!r} twice: give each axis once")
    named.add(name)
    if int(value) == 0 or int(value) < -1:
      raise MeshError(f"mesh {spec!r}: {name}:{value} is no size (a positive count, or -1 for the devices left)")
    if int(value) == -1:
      if free is not None:
        raise MeshError(f"mesh {spec!r}: only one axis may be -1")
      free = name
    else:
      sizes[name] = int(value)
  fixed = int(np.prod(list(sizes.values())))
  if free is not None:
    if num_devices % fixed:
      raise MeshError(f"mesh {spec!r}: {num_devices} devices are not divisible by {fixed}")
    sizes[free] = num_devices // fixed
  if int(np.prod(list(sizes.values()))) != num_devices:
    raise MeshError(f"mesh {spec!r} has {int(np.prod(list(sizes.values())))} devices, but there are {num_devices}")
  return sizes


def make_mesh(spec: str = "data:-1", devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(devices if devices is not None else jax.devices())
  sizes = parse_mesh_shape(spec, len(devices))
  grid = np.asarray(devices).reshape([sizes[a] for a in MESH_AXES])
  return Mesh(grid, MESH_AXES)


def fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh) -> PartitionSpec:
  """Replicates any dim that its mesh axes do not divide (9 heads on a 2-way model axis stay whole)."""
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    fitted.append(axes if size > 1 and dim % size == 0 else None)
  return PartitionSpec(*fitted)


def logical_to_sharding(logical_specs: Any, abstract: Any, mesh: Mesh, rules=LOGICAL_RULES) -> Any:
  """Trees of logical PartitionSpecs and of shapes -> a tree of NamedShardings on `mesh`."""
  return jax.tree.map(
    lambda spec, leaf: NamedSharding(mesh, fit_spec(nn.logical_to_mesh_axes(tuple(spec), rules), leaf.shape, mesh)),
    logical_specs,
    abstract,
    is_leaf=lambda x: isinstance(x, PartitionSpec),
  )


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def from_process_0(value: np.ndarray) -> np.ndarray:
  """Process 0's `value` on every process (a no-op with one process): where only process 0 reads files, the others
  learn what it found."""
  if jax.process_count() == 1:
    return np.asarray(value)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.broadcast_one_to_all(value))
