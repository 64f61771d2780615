"""What the converters of architectures with their own parameter tree (Kimi-Audio's `kimi_release`, MiMo-Audio's
`mimo_release`, Step-Audio 2's `step_audio2_release`) share: a release's rules checked against its keys and shapes before any tensor is read, and the
checkpoint's leaves read from it one at a time."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from checkpoints_conversion.convert import ConversionError
from checkpoints_conversion.sources import TensorSource
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model.families import keymap


def check_release(source: TensorSource, abstract: Any, ruled: list[keymap.Rule], model: str,
                  also: Mapping[str, tuple[int, ...]] = {}) -> None:
  """Every problem of a release against the rules of every leaf of `abstract` and the tensors `also` names (key ->
  shape: tensors the release must hold that no rule reads, such as an audio encoder the build runs): a missing,
  mis-shaped or unexpected tensor, listed at once on one line in a ConversionError naming the `model` it does not
  fit."""
  shapes = {key: source.shape(key) for key in source.keys()}
  problems, rest = keymap.check_rules(set(dict(checkpoint.flatten(abstract))), ruled, shapes)
  for key, shape in also.items():
    if key not in shapes:
      problems.append(f"missing key {key} (read by the build, not converted)")
    elif tuple(shapes[key]) != tuple(shape):
      problems.append(f"shape mismatch at {key}: checkpoint has {tuple(shapes[key])}, config.json implies {shape}")
  unexpected = [key for key in rest if key not in also and not key.endswith(keymap.HF_IGNORED_SUFFIXES)]
  if unexpected:
    problems.append(f"{len(unexpected)} unexpected key(s) that no rule reads: {', '.join(unexpected[:20])}")
  if problems:
    raise ConversionError(f"{source.description} does not fit a {model} target: " + "; ".join(problems))


def iter_leaves(abstract: Any, ruled: list[keymap.Rule], source: TensorSource
                ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(stored path, array) per leaf of `abstract` (ShapeDtypeStructs of the target dtype), reading only that leaf's
  tensors: the top-level `layers` one layer at a time (as the checkpoint stores them), other stacks stacked."""
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
  """How many leaves `iter_leaves` yields: one per layer of the top-level stack, one per other rule."""
  return sum(len(rule.pieces) if rule.target[0] == "layers" else 1 for rule in ruled)
