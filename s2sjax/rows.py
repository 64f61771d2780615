"""Row formats: what a packed row holds, for the packer, the TFDS feature spec, the scorer and the task data alike.

A `RowFormat` names its fields, the shape of each per `packing.RowShape` (L positions, M targets, C slots and a
trailing width W: codebooks of token rows, streams of stream rows), the value that pads it, and the fields a build's
fingerprint hashes. Two are built in, registered in `ROW_FORMATS` (a `s2sjax.registry.Registry`):

  token rows   tokens [L], audio_codes [L, K] (K codebooks at placeholder positions; stored only when K > 0),
               target_ids [M]: one id per position, as the shared decoder reads them (s2sjax/packing.py's header)
  stream rows  stream_tokens [L, S], target_frame [M, S], target_weight [M, S]: S parallel streams per position
               (text first), each target a whole predicted step with a weight per stream (`packing.pack_streams`)

and every row carries the shared fields: segment_ids, branch_ids, positions [L]; target_pos, target_slot [M];
slot_item, slot_candidate [C]. An architecture (s2sjax/architectures) names the format its scorer reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from s2sjax.registry import Registry

# Shared by every format: (name, axis, padding value). Segment 0 is padding; slot and target -1 score nothing.
_SHARED_POSITIONS = (("segment_ids", 0), ("branch_ids", 0), ("positions", 0))
_SHARED_TARGETS = (("target_pos", 0),)
_SLOTS = (("slot_item", -1), ("slot_candidate", -1))


@dataclasses.dataclass(frozen=True)
class Field:
  name: str
  axis: str  # "L" (per position), "M" (per target) or "C" (per slot)
  fill: int  # what padding rows hold
  wide: bool = False  # a trailing width axis W (codebooks or streams)


@dataclasses.dataclass(frozen=True)
class RowFormat:
  """One kind of packed row. `marker` is the field only rows of this format hold; `scored` what a build's
  fingerprint hashes besides the slot tables (`fingerprint_fields`); `streams` says whether W counts streams (the
  text stream and one per codebook, 1 + K) or codebooks (K); `optional` fields are stored only when W > 0;
  `audio_mode` is the spec audio mode (s2sjax/spec.py) whose builds are rows of this format."""

  name: str
  marker: str
  own_positions: tuple[Field, ...]  # the format's per-position fields, before the shared ones
  own_targets: tuple[Field, ...]  # the format's per-target fields, after target_pos
  scored: tuple[str, ...]
  streams: bool = False
  optional: tuple[str, ...] = ()
  audio_mode: str | None = None  # the spec audio mode whose builds are rows of this format (None: every other)

  @property
  def fields(self) -> tuple[Field, ...]:
    """Every field, in the order rows are laid out and listed."""
    field = lambda pairs, axis: tuple(Field(name, axis, fill) for name, fill in pairs)
    return (self.own_positions + field(_SHARED_POSITIONS, "L") + field(_SHARED_TARGETS, "M") + self.own_targets
            + (Field("target_slot", "M", -1),) + field(_SLOTS, "C"))

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(f.name for f in self.fields)

  @property
  def wide(self) -> tuple[str, ...]:
    """The fields with a trailing width axis."""
    return tuple(f.name for f in self.fields if f.wide)

  @property
  def step_fields(self) -> tuple[str, ...]:
    """What a scoring step reads of each row: every field but the slot tables (the host maps slots back), and
    `row_id`, which places each row's results."""
    return tuple(name for name in self.names if not name.startswith("slot_")) + ("row_id",)

  @property
  def fingerprint_fields(self) -> tuple[str, ...]:
    """What `task_data.TaskData.fingerprint` hashes, in order: what is scored, then where each candidate lies."""
    return self.scored + ("target_slot", "slot_item", "slot_candidate")

  def width(self, shape) -> int:
    """W of rows of a `packing.RowShape`: its codebooks, or for streams the text stream and each codebook."""
    return 1 + shape.num_codebooks if self.streams else shape.num_codebooks

  def width_of(self, rows: Mapping[str, np.ndarray]) -> int:
    """W of packed rows (a scorer may read rows of fewer streams than a model reads)."""
    return rows[self.wide[0]].shape[-1]

  def shapes(self, length: int | None, targets: int | None, slots: int | None,
             width: int) -> dict[str, tuple[int | None, ...]]:
    """Each stored field's per-row shape (None: a size the build fits to its rows, as TFDS features take it)."""
    size = {"L": length, "M": targets, "C": slots}
    return {f.name: (size[f.axis],) + ((width,) if f.wide else ()) for f in self.fields
            if not (f.name in self.optional and width == 0)}

  def empty(self, count: int, shape, width: int | None = None) -> dict[str, np.ndarray]:
    """`count` padding rows of a `packing.RowShape` (and `width`, the shape's by default): they score nothing."""
    width = self.width(shape) if width is None else width
    size = {"L": shape.length, "M": shape.max_targets, "C": shape.max_slots}
    return {f.name: np.full((count, size[f.axis]) + ((width,) if f.wide else ()), f.fill, np.int32)
            for f in self.fields}

  def stored(self, rows: Mapping[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
    """The fields a build writes: an optional field is left out at width 0."""
    return {name: value for name, value in rows.items() if not (name in self.optional and width == 0)}

  def completed(self, rows: dict[str, np.ndarray]) -> dict[str, Any]:
    """Stored rows with their optional fields back (width 0), as the packer and the scorer read them."""
    positions = rows["segment_ids"].shape
    return {**rows, **{name: np.zeros(positions + (0,), np.int32) for name in self.optional if name not in rows}}


TOKEN_ROWS = RowFormat(
  "tokens", marker="tokens",
  own_positions=(Field("tokens", "L", 0), Field("audio_codes", "L", -1, wide=True)),
  own_targets=(Field("target_ids", "M", 0),),
  scored=("tokens", "audio_codes", "target_pos", "target_ids"),
  optional=("audio_codes",),
)
STREAM_ROWS = RowFormat(
  "streams", marker="stream_tokens",
  own_positions=(Field("stream_tokens", "L", -1, wide=True),),
  own_targets=(Field("target_frame", "M", -1, wide=True), Field("target_weight", "M", 0, wide=True)),
  scored=("stream_tokens", "target_pos", "target_frame", "target_weight"),
  streams=True, audio_mode="parallel_streams",
)

ROW_FORMATS: Registry[RowFormat] = Registry("row format")
ROW_FORMATS.register(TOKEN_ROWS)
ROW_FORMATS.register(STREAM_ROWS)

