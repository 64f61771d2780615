"""Reads and writes the safetensors format with numpy alone (bf16 through ml_dtypes).

Reading memory-maps the file, so a tensor costs memory only when it is used; writing streams one tensor at a
time. The format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, bytes.
"""

from __future__ import annotations

import json
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

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


def read_header(path: str) -> tuple[dict, int]:
  """(tensor table, byte offset of the data section) of one .safetensors file."""
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise ValueError(f"{path}: too short to be a safetensors file")
    (size,) = struct.unpack("<Q", raw)
    try:
      header = json.loads(f.read(size))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{path}: corrupt safetensors header ({e})") from e
  header.pop("__metadata__", None)
  return header, 8 + size


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
      raise ValueError(f"{self.path}: tensor {name} has unsupported dtype {entry['dtype']}")
    begin, end = entry["data_offsets"]
    dtype = DTYPES[entry["dtype"]]
    shape = tuple(entry["shape"])
    if end - begin != dtype.itemsize * int(np.prod(shape)):
      raise ValueError(f"{self.path}: tensor {name} has {end - begin} bytes, shape {shape} needs more or fewer")
    return np.memmap(self.path, dtype=dtype, mode="r", offset=self._data_start + begin, shape=shape)


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
