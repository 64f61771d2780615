"""Reads and writes the safetensors format with numpy alone (bf16 through ml_dtypes).

Reading memory-maps the file, so a tensor costs memory only when it is used; writing streams one tensor at a
time. The format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

from s2sjax.runtime.errors import UserError

DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class SafetensorsError(UserError, ValueError):
  """A .safetensors file that is truncated, corrupt or holds a dtype this reader lacks; names the file."""


def read_header(path: str) -> tuple[dict, int]:
  """(tensor table, byte offset of the data section) of one .safetensors file, checked against the file's size
  so that a truncated or corrupt file fails here, naming every bad tensor, and not when a tensor is mapped."""
  file_size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise SafetensorsError(f"{path}: too short to be a safetensors file")
    (size,) = struct.unpack("<Q", raw)
    if size > file_size - 8:
      raise SafetensorsError(f"{path}: corrupt safetensors header (length prefix {size}, file size {file_size} bytes)")
    try:
      header = json.loads(f.read(size), object_pairs_hook=lambda pairs: _refuse_repeated_keys(pairs, path))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise SafetensorsError(f"{path}: corrupt safetensors header ({e})") from e
  if not isinstance(header, dict):
    raise SafetensorsError(f"{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object)")
  header.pop("__metadata__", None)
  problems = _entry_problems(header, file_size - 8 - size)
  if problems:
    raise SafetensorsError("\n".join(f"{path}: {problem}" for problem in problems))
  return header, 8 + size


def _refuse_repeated_keys(pairs: list[tuple[str, object]], path) -> dict:
  """A JSON object as a dict, unless it names a key twice (json.loads would keep the last silently)."""
  found = {}
  for key, value in pairs:
    if key in found:
      raise SafetensorsError(f"{path}: the safetensors header names {key!r} twice: which entry is meant cannot be "
                             "told")
    found[key] = value
  return found


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _entry_problems(header: dict, data_size: int) -> list[str]:
  """Every tensor entry that is malformed, lies past the data section, disagrees with its dtype x shape, or
  overlaps another; and every span of the data section no tensor covers. The tensors tile the data section, as the
  safetensors library requires (its `Metadata::validate`): a gap is a tensor's bytes whose entry is lost."""
  problems, spans = [], []
  for name, entry in header.items():
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
      problems.append(f"tensor {name}: entry {entry!r} lacks dtype, shape or data_offsets")
      continue
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str):
      problems.append(f"tensor {name}: dtype {dtype!r} is not a string")
    elif not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
      problems.append(f"tensor {name}: shape {shape!r} is not a list of non-negative integers")
    elif not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))
              and 0 <= offsets[0] <= offsets[1]):
      problems.append(f"tensor {name}: data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end")
    elif offsets[1] > data_size:
      problems.append(f"tensor {name}: bytes {offsets} lie past the end of the {data_size}-byte data section "
                      "(truncated file?)")
    # Unsupported dtypes have no known size here; `read` refuses them if such a tensor is ever read.
    elif dtype in DTYPES and offsets[1] - offsets[0] != DTYPES[dtype].itemsize * math.prod(shape):
      problems.append(f"tensor {name}: {offsets[1] - offsets[0]} bytes, but {dtype} {tuple(shape)} needs "
                      f"{DTYPES[dtype].itemsize * math.prod(shape)}")
    elif offsets[0] < offsets[1]:
      spans.append((offsets[0], offsets[1], name))
  if problems:  # the tiling of a section whose entries are broken says nothing more
    return problems
  reach, reach_name = 0, None  # the furthest end so far, so that nested spans are caught too
  for begin, end, name in sorted(spans):
    if begin < reach:
      problems.append(f"tensors {reach_name} and {name} overlap at bytes [{begin}, {min(end, reach)})")
    elif begin > reach:
      problems.append(f"bytes [{reach}, {begin}) of the data section belong to no tensor (between "
                      f"{reach_name or 'the start'} and {name})")
    if end > reach:
      reach, reach_name = end, name
  if reach < data_size:
    problems.append(f"bytes [{reach}, {data_size}) of the data section belong to no tensor (after "
                    f"{reach_name or 'the start'})")
  return problems


class SafetensorsFile:
  """Lazy view of one .safetensors file: `shape(name)` costs nothing, `read(name)` maps that tensor only."""

  def __init__(self, path: str):
    self.path = path
    self.header, self._data_start = read_header(path)

  def keys(self) -> list[str]:
    return list(self.header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.header[name]["shape"])

  def read(self, name: str) -> np.ndarray:
    entry = self.header[name]
    if entry["dtype"] not in DTYPES:
      raise SafetensorsError(f"{self.path}: tensor {name} has unsupported dtype {entry['dtype']}")
    begin, _ = entry["data_offsets"]  # offsets and size were checked against the file by read_header
    return np.memmap(self.path, dtype=DTYPES[entry["dtype"]], mode="r", offset=self._data_start + begin,
                     shape=tuple(entry["shape"]))


def write(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
  """Writes named arrays (any that expose dtype and shape; their bytes are read one tensor at a time)."""
  header: dict = {"__metadata__": dict(metadata)} if metadata else {}
  offset = 0
  for name, array in tensors.items():
    dtype = np.dtype(array.dtype)
    if dtype not in _NAMES:
      raise ValueError(f"tensor {name}: dtype {dtype} cannot be stored in safetensors")
    nbytes = dtype.itemsize * int(np.prod(array.shape))
    header[name] = {"dtype": _NAMES[dtype], "shape": list(array.shape), "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # data section aligned to 8 bytes, as the reference writer does
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for array in tensors.values():
      f.write(np.ascontiguousarray(array).tobytes())
