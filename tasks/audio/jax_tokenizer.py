"""The batched runner every JAX audio tokenizer shares: waves -> segments -> host features -> length buckets ->
one jitted forward per bucket shape, data-parallel over the host's devices -> codes per wave.

A tokenizer says how one segment becomes features (`prepare`) and how a padded batch of features becomes codes
(`apply`, pure JAX). `apply` must be batch-invariant (a row's codes depend on its own frames only), which is what
lets utterances of different lengths share a batch and gives the same codes alone or together.
"""

from __future__ import annotations

import abc
import collections
import math
import time

import numpy as np

from s2sjax.runtime.progress import Progress
from tasks.audio.base import AudioError, AudioTokenizer, AudioTokenizerError

# Frames (of the features' time axis) per batch: a bucket of length T holds about BATCH_FRAMES // T segments,
# rounded to the device count, so a batch's activation memory is about the same whatever the bucket.
BATCH_FRAMES = 1 << 15
# Bytes of one [rows, heads, steps, steps] fp32 attention tensor a batch may hold: attention grows with the square
# of a segment's length, so long buckets take fewer rows than BATCH_FRAMES alone would give them.
ATTENTION_BYTES = 1 << 28
# Padded lengths grow in steps of 2^(1/8): at most 9% padding (the torch side computes none), and a few dozen shapes
# for any corpus (each compiles once, in seconds).
BUCKET_STEPS_PER_OCTAVE = 8
FLOAT_DTYPES = ("float32", "bfloat16")


def bucket_length(frames: int, multiple: int) -> int:
  """The padded length a segment of `frames` frames is laid in: the next step of the geometric grid, rounded up
  to `multiple`."""
  step = 2 ** (math.ceil(BUCKET_STEPS_PER_OCTAVE * math.log2(max(frames, 1))) / BUCKET_STEPS_PER_OCTAVE)
  return max(multiple, math.ceil(math.ceil(step) / multiple) * multiple)


class JaxAudioTokenizer(AudioTokenizer):
  """Subclasses set `sample_rate`, `codebook_sizes`, `num_codebooks`, `frame_rate`, `params` (a pytree of float32
  arrays), `segment_samples` and `time_multiple`, and implement `prepare`, `apply` and `identity`."""

  frame_rate: float
  segment_samples: int | None = None  # longer audio is cut into segments of this many samples (the model's window)
  time_multiple: int = 1  # a batch's padded time length is a multiple of this
  params: dict
  dtype: str = "float32"
  mesh_spec: str = "data:-1"
  batch_frames: int = BATCH_FRAMES
  attention_heads: int = 0  # of the widest attention layer; 0: none
  attention_stride: int = 1  # feature frames per attention step

  @abc.abstractmethod
  def prepare(self, segment: np.ndarray) -> tuple[np.ndarray, int]:
    """(features [T, C] float32 of one segment, the number of code frames it yields; 0 drops the segment)."""

  @abc.abstractmethod
  def apply(self, params, features, lengths):
    """Pure JAX: features [B, T, C] zero-padded past `lengths` [B] -> int32 codes [B, F, K], F >= every n_codes."""

  def finish(self, codes: np.ndarray) -> np.ndarray:
    """What happens to a whole utterance's codes after its segments are joined (dedup, for unit LMs)."""
    return codes

  def configure(self, dtype: str = "float32", mesh: str = "data:-1") -> "JaxAudioTokenizer":
    """The compute dtype (fp32 by default; bf16 casts weights and features) and the mesh the batch is split over
    (`data:-1`: every local device)."""
    if dtype not in FLOAT_DTYPES:
      raise AudioTokenizerError(f"audio tokenizer dtype {dtype!r}: choose one of {', '.join(FLOAT_DTYPES)}")
    self.dtype, self.mesh_spec = dtype, mesh
    self.__dict__.pop("_runner", None)
    return self

  def segments(self, wave: np.ndarray) -> list[np.ndarray]:
    if self.segment_samples is None or len(wave) <= self.segment_samples:
      return [wave]
    return [wave[start:start + self.segment_samples] for start in range(0, len(wave), self.segment_samples)]

  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    return self.encode_batch([wave], [uttid])[0]

  def encode_batch(self, waves: list[np.ndarray], names: list[str] | None = None,
                   progress: str | Progress | None = None) -> list[np.ndarray]:
    """int32 codes [frames, codebooks] of each wave, in length-bucketed batches over the mesh."""
    pieces: list[tuple[int, np.ndarray, int]] = []  # (wave index, features, n_codes)
    for index, wave in enumerate(waves):
      for segment in self.segments(wave):
        try:
          features, n_codes = self.prepare(segment)
        except ValueError as e:  # too short for the model's front end, say
          raise AudioError(f"{names[index] if names else index}: {e}") from e
        if n_codes > 0:
          pieces.append((index, features, n_codes))
    meter = (Progress(len(waves), progress, unit="utterances", rate_unit="audio s") if isinstance(progress, str)
             else progress)
    seconds = [len(w) / self.sample_rate for w in waves]
    remaining = collections.Counter(index for index, _, _ in pieces)  # segments still to run, per wave
    codes: dict[int, list[tuple[int, np.ndarray]]] = {i: [] for i in range(len(waves))}
    for batch in self._batches(pieces):
      for (order, (index, _, n_codes)), row in zip(batch, self._run([p for _, p in batch])):
        codes[index].append((order, row[:n_codes]))
        remaining[index] -= 1
        if meter and remaining[index] == 0:
          meter.update(1, seconds[index])
    out = []
    for index in range(len(waves)):
      if not codes[index]:
        out.append(np.zeros((0, self.num_codebooks), np.int32))
        if meter:
          meter.update(1, seconds[index])
        continue
      joined = np.concatenate([c for _, c in sorted(codes[index], key=lambda oc: oc[0])])
      out.append(self.finish(joined.astype(np.int32)))
    return out

  def _batches(self, pieces):
    """Pieces grouped by bucket length, longest first, in batches of about `batch_frames` frames."""
    by_length: dict[int, list] = {}
    for order, piece in enumerate(pieces):
      by_length.setdefault(bucket_length(len(piece[1]), self.time_multiple), []).append((order, piece))
    devices = self.runner.devices
    for length in sorted(by_length, reverse=True):
      group = by_length[length]
      size = max(devices, self.batch_rows(length) // devices * devices)
      for start in range(0, len(group), size):
        yield group[start:start + size]

  def batch_rows(self, length: int) -> int:
    """Segments of a bucket of `length` frames laid in one batch: `batch_frames` frames, and no more attention
    weights than ATTENTION_BYTES."""
    rows = self.batch_frames // length
    if self.attention_heads:
      rows = min(rows, ATTENTION_BYTES // (self.attention_heads * 4 * (-(-length // self.attention_stride)) ** 2))
    return max(1, rows)

  def _run(self, pieces: list[tuple[int, np.ndarray, int]]) -> np.ndarray:
    length = bucket_length(max(len(p[1]) for p in pieces), self.time_multiple)
    rows = math.ceil(len(pieces) / self.runner.devices) * self.runner.devices
    features = np.zeros((rows, length, pieces[0][1].shape[1]), np.float32)
    lengths = np.zeros((rows,), np.int32)
    for r, (_, f, _) in enumerate(pieces):
      features[r, : len(f)], lengths[r] = f, len(f)
    return self.runner(features, lengths)[: len(pieces)]

  @property
  def runner(self) -> "_Runner":
    if "_runner" not in self.__dict__:
      self.__dict__["_runner"] = _Runner(self)
    return self.__dict__["_runner"]


ALIGNMENT = 64  # bytes: XLA:CPU places a host array this aligned without copying it (numpy's own are 16)


def aligned_empty(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
  """An uninitialised C-contiguous array at an ALIGNMENT-byte address."""
  size = int(np.prod(shape)) * np.dtype(dtype).itemsize
  buffer = np.empty(size + ALIGNMENT, np.uint8)
  start = -buffer.ctypes.data % ALIGNMENT
  return buffer[start:start + size].view(dtype).reshape(shape)


def aligned(array) -> np.ndarray:
  """`array` itself when C-contiguous at an ALIGNMENT-byte address, else an equal copy that is."""
  array = np.asarray(array)
  if array.flags.c_contiguous and array.ctypes.data % ALIGNMENT == 0:
    return array
  out = aligned_empty(array.shape, array.dtype)
  out[...] = array
  return out


class _Runner:
  """The tokenizer's `apply` jitted over a data-parallel mesh, its weights placed once on every device."""

  def __init__(self, tokenizer: JaxAudioTokenizer):
    # jax (and s2sjax.runtime.sharding, which imports it) loads once a tokenizer runs, not when a build merely names one
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from s2sjax.runtime.sharding import MeshError, make_mesh

    mesh = make_mesh(tokenizer.mesh_spec, jax.local_devices())
    if any(mesh.shape[axis] > 1 for axis in mesh.axis_names if axis != "data"):
      raise MeshError(f"--mesh {tokenizer.mesh_spec}: audio tokenizers split batches only (data axis)")
    self.devices = mesh.shape["data"]
    dtype = jnp.dtype(tokenizer.dtype)
    self.dtype = dtype
    # host arrays straight to device_put (a jnp array first would be a second copy while the first is placed)
    cast = lambda x: np.asarray(x).astype(dtype, copy=False) if np.issubdtype(np.asarray(x).dtype, np.floating) \
        else np.asarray(x)
    replicated = NamedSharding(mesh, PartitionSpec())
    if mesh.devices.flat[0].platform == "cpu":
      # XLA:CPU reads a 64-byte-aligned host array in place and copies any other: with aligned weights the host
      # copy and the placed one are one copy, not two (1.3 GB for GLM-4-Voice's encoder)
      tokenizer.params = jax.tree_util.tree_map(aligned, tokenizer.params)
    self.params = jax.device_put(jax.tree_util.tree_map(cast, tokenizer.params), replicated)
    self.batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    self.step = jax.jit(tokenizer.apply, out_shardings=self.batch_sharding)
    self.compile_seconds = 0.0
    self._shapes: set[tuple[int, ...]] = set()

  def __call__(self, features: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    import jax

    start = time.time()
    new_shape = features.shape not in self._shapes
    features = jax.device_put(features.astype(self.dtype), self.batch_sharding)
    codes = np.asarray(self.step(self.params, features, jax.device_put(lengths, self.batch_sharding)))
    if new_shape:
      self._shapes.add(features.shape)
      self.compile_seconds += time.time() - start
    return codes
