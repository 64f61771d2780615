"""The leaves of an architecture's own checkpoint read from a release by its rules (the converters of Kimi-Audio
and Step-Audio 2): each leaf reads only its own tensors, and the top-level `layers` stack is written one layer at a
time, as the checkpoint stores it for every architecture."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from checkpoints_conversion.sources import TensorSource
from s2sjax.scoring import checkpoint
from s2sjax.scoring.families import keymap


def iter_leaves(abstract: Any, ruled: list[keymap.Rule], source: TensorSource
                ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(stored path, array) per leaf of the `abstract` tree (ShapeDtypeStructs in the target dtype); other stacked
  leaves are written whole."""
  leaves = dict(checkpoint.flatten(abstract))
  for rule in ruled:
    target = leaves[rule.target]
    layer_shape = rule.per_layer_shape(target.shape)
    arrays = (rule.to_target(source.read(piece.key), piece, layer_shape).astype(target.dtype) for piece in rule.pieces)
    if rule.target[0] == "layers":
      for i, array in enumerate(arrays):
        yield ("layers", str(i)) + rule.target[1:], array
    elif rule.stacked:
      yield rule.target, np.stack(list(arrays))
    else:
      yield rule.target, next(arrays)


def leaf_count(ruled: list[keymap.Rule]) -> int:
  """How many leaves `iter_leaves` yields (the progress line's total)."""
  return sum(len(rule.pieces) if rule.target[0] == "layers" else 1 for rule in ruled)
