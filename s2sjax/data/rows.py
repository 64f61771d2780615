"""Row formats: what a packed row holds, for the packer, the TFDS feature spec, the scorer and the task data alike.

A `RowFormat` names its fields, each typed as seqio's `Feature` is: its axis (L positions, M targets, C slots, as
`packing.RowShape` sizes them), its dtype (int32 ids and tables; a float dtype for continuous features, as seqio's
`ContinuousFeature`), the value that pads it, and a trailing width where it has one, named (`codebooks`,
`streams`, a feature width): a build gives each width its size (`InputFormat.widths`, s2sjax/data/formats), and rows
carry it (`widths_of`). It also names the fields a build's fingerprint hashes. Two are built in, each owned by the
input formats that lay it (s2sjax/data/formats):

  token rows   tokens [L], audio_codes [L, codebooks] (codebooks at placeholder positions; stored only when there
               are any), target_ids [M]: one id per position, as the shared decoder reads them (s2sjax/data/packing.py)
  stream rows  stream_tokens [L, streams], target_frame [M, streams], target_weight [M, streams]: parallel streams
               per position (text first), each target a whole predicted step with a weight per stream
               (s2sjax/data/formats/streams.py)

and every row carries the shared fields: segment_ids, branch_ids, positions [L]; target_pos, target_slot [M];
slot_item, slot_candidate [C]. An architecture (s2sjax/scoring/architectures) names the format its scorer reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Mapping

import numpy as np

# Shared by every format: (name, padding value). Segment 0 is padding; slot and target -1 score nothing.
_SHARED_POSITIONS = (("segment_ids", 0), ("branch_ids", 0), ("positions", 0))
_SHARED_TARGETS = (("target_pos", 0),)
_SLOTS = (("slot_item", -1), ("slot_candidate", -1))
DTYPES = ("int32", "float32", "float16", "bfloat16")  # what a field may hold (TFDS stores each as it is)


@dataclasses.dataclass(frozen=True)
class Field:
  name: str
  axis: str  # "L" (per position), "M" (per target) or "C" (per slot)
  fill: int | float  # what padding rows hold
  dtype: str = "int32"  # of DTYPES: ids and tables are int32, continuous features a float dtype
  width: str | None = None  # the name of its trailing axis (its size is the build's), None: no trailing axis

  def __post_init__(self):
    if self.axis not in ("L", "M", "C") or self.dtype not in DTYPES:
      raise ValueError(f"row field {self.name}: axis {self.axis!r} (L, M, C) or dtype {self.dtype!r} {DTYPES}")

  @property
  def np_dtype(self) -> np.dtype:
    if self.dtype == "bfloat16":
      import ml_dtypes  # jax's own dependency: numpy has no bfloat16

      return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class RowFormat:
  """One kind of packed row. `marker` is the field only rows of this format hold; `scored` what a build's
  fingerprint hashes besides the slot tables (`fingerprint_fields`); `optional` fields are stored only when their
  width is not 0."""

  name: str
  marker: str
  own_positions: tuple[Field, ...]  # the format's per-position fields, before the shared ones
  own_targets: tuple[Field, ...]  # the format's per-target fields, after target_pos
  scored: tuple[str, ...]
  optional: tuple[str, ...] = ()

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
    return tuple(f.name for f in self.fields if f.width)

  @property
  def step_fields(self) -> tuple[str, ...]:
    """What a scoring step reads of each row: every field but the slot tables (the host maps slots back), and
    `row_id`, which places each row's results."""
    return tuple(name for name in self.names if not name.startswith("slot_")) + ("row_id",)

  @property
  def fingerprint_fields(self) -> tuple[str, ...]:
    """What `task_data.TaskData.fingerprint` hashes, in order: what is scored, then where each candidate lies."""
    return self.scored + ("target_slot", "slot_item", "slot_candidate")

  def widths_of(self, rows: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Each width's size in packed rows (a scorer may read rows of fewer streams than a model reads)."""
    widths = {}
    for f in self.fields:
      if f.width and f.width not in widths and f.name in rows:
        widths[f.width] = rows[f.name].shape[-1]
    return widths

  def shapes(self, length: int | None, targets: int | None, slots: int | None,
             widths: Mapping[str, int | None]) -> dict[str, tuple[int | None, ...]]:
    """Each stored field's per-row shape (None: a size the build fits to its rows, as TFDS features take it)."""
    size = {"L": length, "M": targets, "C": slots}
    return {f.name: (size[f.axis],) + ((widths[f.width],) if f.width else ()) for f in self.fields
            if not self._left_out(f, widths)}

  def dtypes(self) -> dict[str, np.dtype]:
    return {f.name: f.np_dtype for f in self.fields}

  def empty(self, count: int, shape, widths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """`count` padding rows of a `packing.RowShape` and these widths: they score nothing."""
    size = {"L": shape.length, "M": shape.max_targets, "C": shape.max_slots}
    return {f.name: np.full((count, size[f.axis]) + ((widths[f.width],) if f.width else ()), f.fill, f.np_dtype)
            for f in self.fields}

  def stored(self, rows: Mapping[str, np.ndarray], widths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The fields a build writes, each in its dtype: an optional field is left out at width 0."""
    dtypes = self.dtypes()
    return {f.name: np.asarray(rows[f.name], dtypes[f.name]) for f in self.fields if not self._left_out(f, widths)}

  def completed(self, rows: dict[str, np.ndarray]) -> dict[str, Any]:
    """Stored rows with their optional fields back (width 0), as the packer and the scorer read them."""
    positions = rows["segment_ids"].shape
    return {**rows, **{f.name: np.zeros(positions + (0,), f.np_dtype) for f in self.fields
                       if f.name in self.optional and f.name not in rows}}

  def checksum(self, rows: Mapping[str, np.ndarray]) -> str:
    """A hash of every stored field (name, shape, little-endian bytes of its dtype), in name order: what the build
    wrote is what the evaluator reads."""
    dtypes, digest = self.dtypes(), hashlib.sha256()
    for name in sorted(rows):
      array = np.ascontiguousarray(rows[name], dtype=dtypes[name].newbyteorder("<"))
      digest.update(f"{name}{list(array.shape)}".encode() + b"\0" + array.tobytes())
    return digest.hexdigest()

  def _left_out(self, field: Field, widths: Mapping[str, int | None]) -> bool:
    return field.name in self.optional and widths.get(field.width) == 0


TOKEN_ROWS = RowFormat(
  "tokens", marker="tokens",
  own_positions=(Field("tokens", "L", 0), Field("audio_codes", "L", -1, width="codebooks")),
  own_targets=(Field("target_ids", "M", 0),),
  scored=("tokens", "audio_codes", "target_pos", "target_ids"),
  optional=("audio_codes",),
)
STREAM_ROWS = RowFormat(
  "streams", marker="stream_tokens",
  own_positions=(Field("stream_tokens", "L", -1, width="streams"),),
  own_targets=(Field("target_frame", "M", -1, width="streams"), Field("target_weight", "M", 0, width="streams")),
  scored=("stream_tokens", "target_pos", "target_frame", "target_weight"),
)
