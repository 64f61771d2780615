"""The batched runner every JAX audio tokenizer shares: waves -> segments -> host features -> padded shapes -> one
compiled forward per shape, data-parallel over the host's devices -> codes per wave.

A tokenizer says how one segment becomes features (`prepare`) and how a padded batch of features becomes codes
(`apply`, pure JAX). `apply` must be batch-invariant (a row's codes depend on its own frames only, whatever
padding follows them), which is what lets utterances of different lengths share a batch, and gives the same codes
alone or together, and under either shape policy (`SHAPE_POLICIES`):

- buckets: each batch padded to the next step of a geometric grid (8 per octave): the least padding, a few dozen
  shapes over a corpus, each compiled once. What a CPU gets (`auto`): compiling there takes a second or two.
- windows: WINDOWS fixed lengths, geometric from WINDOW_FLOOR_SECONDS up to the model's own window (Whisper's 30 s
  for the Whisper-based tokenizers, `segment_samples`) or, for a model that takes a whole recording (Mimi, HuBERT),
  up to the longest recording rounded up to a power of two seconds; each window's batch has a fixed number of rows
  (empty rows fill the last), sized from the device's free memory. At most WINDOWS programs for any corpus: what
  an accelerator gets (`auto`), where each compile costs tens of seconds of autotuning.
"""

from __future__ import annotations

import abc
import collections
import math
import time

import numpy as np

from s2sjax.runtime.progress import Progress
from tasks.audio.base import AudioError, AudioTokenizer, AudioTokenizerError, hash_array

# Frames (of the features' time axis) per batch on a CPU: a bucket of length T holds about BATCH_FRAMES // T
# segments, rounded to the device count, so a batch's activation memory is about the same whatever the bucket.
BATCH_FRAMES = 1 << 15
# Bytes of one [rows, heads, steps, steps] fp32 attention tensor a batch may hold on a CPU: attention grows with the
# square of a segment's length, so long buckets take fewer rows than BATCH_FRAMES alone would give them.
ATTENTION_BYTES = 1 << 28
# Padded lengths grow in steps of 2^(1/8): at most 9% padding (the torch side computes none), and a few dozen shapes
# for any corpus (each compiles once, in seconds).
BUCKET_STEPS_PER_OCTAVE = 8
FLOAT_DTYPES = ("float32", "bfloat16")
SHAPE_POLICIES = ("auto", "windows", "buckets")
WINDOWS = 4  # the windows policy's shapes: at most this many programs per tokenizer
WINDOW_FLOOR_SECONDS = 2.0  # the shortest window (a spoken option of sCMMLU is 1-3 s)
# On an accelerator, the share of the device's free memory (after the weights) one batch's activations may take:
# the rest is XLA's workspace, and the estimate of `frame_bytes` is rough.
DEVICE_MEMORY_SHARE = 0.5
MAX_ROWS = 64  # rows of one batch on an accelerator, whatever the memory: more only adds empty rows at the end


def bucket_length(frames: int, multiple: int) -> int:
  """The padded length a segment of `frames` frames is laid in: the next step of the geometric grid, rounded up
  to `multiple`."""
  step = 2 ** (math.ceil(BUCKET_STEPS_PER_OCTAVE * math.log2(max(frames, 1))) / BUCKET_STEPS_PER_OCTAVE)
  return max(multiple, math.ceil(math.ceil(step) / multiple) * multiple)


def window_seconds(top_seconds: float) -> list[float]:
  """The windows policy's lengths in seconds, shortest first: WINDOWS of them spaced geometrically from
  WINDOW_FLOOR_SECONDS to `top_seconds` (one, when the top is no longer than the floor)."""
  if top_seconds <= WINDOW_FLOOR_SECONDS:
    return [top_seconds]
  ratio = top_seconds / WINDOW_FLOOR_SECONDS
  return [WINDOW_FLOOR_SECONDS * ratio ** (k / (WINDOWS - 1)) for k in range(WINDOWS - 1)] + [top_seconds]


class JaxAudioTokenizer(AudioTokenizer):
  """Subclasses set `sample_rate`, `codebook_sizes`, `num_codebooks`, `frame_rate`, `params` (a pytree of float32
  arrays), `segment_samples`, `time_multiple` and `frame_bytes`, and implement `prepare`, `apply` and `identity`.
  `configure` chooses the dtype, the mesh and the shape policy; `run_report` says what the runner compiled and
  tokenized."""

  frame_rate: float
  segment_samples: int | None = None  # longer audio is cut into segments of this many samples (the model's window)
  time_multiple: int = 1  # a batch's padded time length is a multiple of this
  params: dict
  dtype: str = "float32"
  mesh_spec: str = "data:-1"
  shapes: str = "auto"  # one of SHAPE_POLICIES
  batch_frames: int = BATCH_FRAMES
  # Peak activation bytes a row holds per feature frame (fp32, the widest layer's tensors alive at once): sizes an
  # accelerator's batches from its free memory. 0: unknown, the CPU's `batch_frames` rule is kept there too.
  frame_bytes: int = 0
  attention_heads: int = 0  # of the widest attention layer; 0: none
  attention_stride: int = 1  # feature frames per attention step
  # The longest wave (samples) a caller will give over several encode_batch calls: windows are laid for it, so
  # every call compiles the same shapes. None: each call's own longest.
  expected_longest_samples: int | None = None

  @abc.abstractmethod
  def prepare(self, segment: np.ndarray) -> tuple[np.ndarray, int]:
    """(features [T, C] float32 of one segment, the number of code frames it yields; 0 drops the segment)."""

  @abc.abstractmethod
  def apply(self, params, features, lengths):
    """Pure JAX: features [B, T, C] zero-padded past `lengths` [B] -> int32 codes [B, F, K], F >= every n_codes."""

  def finish(self, codes: np.ndarray) -> np.ndarray:
    """What happens to a whole utterance's codes after its segments are joined (dedup, for unit LMs)."""
    return codes

  def configure(self, dtype: str = "float32", mesh: str = "data:-1", shapes: str = "auto") -> "JaxAudioTokenizer":
    """The compute dtype (fp32 by default; bf16 casts weights and features), the mesh the batch is split over
    (`data:-1`: every local device) and the shape policy (`SHAPE_POLICIES`; `auto`: buckets on a CPU, windows on
    an accelerator). The codes are the same under every policy."""
    if dtype not in FLOAT_DTYPES:
      raise AudioTokenizerError(f"audio tokenizer dtype {dtype!r}: choose one of {', '.join(FLOAT_DTYPES)}")
    if shapes not in SHAPE_POLICIES:
      raise AudioTokenizerError(f"audio tokenizer shapes {shapes!r}: choose one of {', '.join(SHAPE_POLICIES)}")
    self.dtype, self.mesh_spec, self.shapes = dtype, mesh, shapes
    self.__dict__.pop("_runner", None)
    return self

  @property
  def policy(self) -> str:
    """The shape policy in force: `shapes`, with `auto` made concrete by the devices the runner uses."""
    if self.shapes != "auto":
      return self.shapes
    return "buckets" if self.runner.platform == "cpu" else "windows"

  def segments(self, wave: np.ndarray) -> list[np.ndarray]:
    if self.segment_samples is None or len(wave) <= self.segment_samples:
      return [wave]
    return [wave[start:start + self.segment_samples] for start in range(0, len(wave), self.segment_samples)]

  def encode(self, wave: np.ndarray, uttid: str) -> np.ndarray:
    return self.encode_batch([wave], [uttid])[0]

  def remember_codes(self) -> "JaxAudioTokenizer":
    """From now on every wave's codes are kept by the wave's content: a later call given the same recording (another
    build's) returns them at once (counted as `reused` in `run_report`)."""
    self.__dict__.setdefault("_remembered", {})
    return self

  def encode_batch(self, waves: list[np.ndarray], names: list[str] | None = None,
                   progress: str | Progress | None = None) -> list[np.ndarray]:
    """int32 codes [frames, codebooks] of each wave, in batches of the policy's shapes over the mesh. In a
    multi-process run each process tokenizes its share (`waves[process_index::process_count]`) and gathers the
    others'; after `remember_codes`, a wave seen before is not tokenized again."""
    meter = (Progress(len(waves), progress, unit="utterances", rate_unit="audio s") if isinstance(progress, str)
             else progress)
    work = self.__dict__.setdefault("_work", {"audio_seconds": 0.0, "seconds": 0.0, "reused": 0})
    remembered = self.__dict__.get("_remembered")
    keys = [hash_array(wave) for wave in waves] if remembered is not None else None
    fresh = [i for i in range(len(waves)) if keys is None or keys[i] not in remembered]
    start = time.time()
    processes, me = self.runner.processes
    mine = fresh[me::processes]  # a multi-process run (`tasks.prepare --distributed`): each its share
    longest = max([len(waves[i]) for i in fresh] + [self.expected_longest_samples or 0])  # every process's windows
    codes = self._encode([waves[i] for i in mine], [names[i] for i in mine] if names else mine, meter, longest)
    if processes > 1 and fresh:  # every process has the same `fresh`: all gather, or none
      codes = gather_codes(codes, len(fresh), self.num_codebooks)
      if meter:
        for i in sorted(set(fresh) - set(mine)):
          meter.update(1, len(waves[i]) / self.sample_rate)
    work["seconds"] += time.time() - start
    work["audio_seconds"] += sum(len(waves[i]) for i in mine) / self.sample_rate
    if keys is None:
      return codes
    for i, each in zip(fresh, codes):
      remembered[keys[i]] = each
    work["reused"] += len(waves) - len(fresh)
    if meter:
      for i in set(range(len(waves))) - set(fresh):
        meter.update(1, len(waves[i]) / self.sample_rate)
    return [remembered[key] for key in keys]

  def _encode(self, waves: list[np.ndarray], names: list, meter: Progress | None, longest: int
              ) -> list[np.ndarray]:
    pieces: list[tuple[int, np.ndarray, int, int]] = []  # (wave index, features, n_codes, samples)
    for index, wave in enumerate(waves):
      for segment in self.segments(wave):
        try:
          features, n_codes = self.prepare(segment)
        except ValueError as e:  # too short for the model's front end, say
          raise AudioError(f"{names[index]}: {e}") from e
        if n_codes > 0:
          pieces.append((index, features, n_codes, len(segment)))
    seconds = [len(w) / self.sample_rate for w in waves]
    remaining = collections.Counter(index for index, _, _, _ in pieces)  # segments still to run, per wave
    codes: dict[int, list[tuple[int, np.ndarray]]] = {i: [] for i in range(len(waves))}
    for batch, length, rows in self._batches(pieces, longest):
      for (order, (index, _, n_codes, _)), row in zip(batch, self._run([p for _, p in batch], length, rows)):
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

  def _batches(self, pieces, longest: int):
    """(pieces, padded length, rows) of each batch: pieces grouped by the policy's length, longest first, in
    batches of `rows_per_batch` rows. Under buckets a group's last batch is cut to the device count; under windows
    every batch of a window has its full rows, so a window is one shape; the windows are laid for `longest`
    samples."""
    windows = self.policy == "windows"
    place = (self._window_placer(longest) if windows and pieces
             else lambda frames: bucket_length(frames, self.time_multiple))
    by_length: dict[int, list] = {}
    for order, piece in enumerate(pieces):
      by_length.setdefault(place(len(piece[1])), []).append((order, piece))
    devices = self.runner.devices
    for length in sorted(by_length, reverse=True):
      group, size = by_length[length], self.rows_per_batch(length)
      for start in range(0, len(group), size):
        batch = group[start:start + size]
        yield batch, length, size if windows else -(-len(batch) // devices) * devices

  def window_lengths(self, longest_samples: int) -> list[int]:
    """The windows policy's padded feature lengths, shortest first (`window_seconds`): up to the model's own window
    (`segment_samples`), or, without one, to `longest_samples` rounded up to a power of two seconds."""
    if self.segment_samples is not None:
      top = self.segment_samples / self.sample_rate
    else:
      top = 2.0 ** max(1, math.ceil(math.log2(max(longest_samples, 1) / self.sample_rate)))
    lengths = {self.feature_frames(round(s * self.sample_rate)) for s in window_seconds(top)}
    return sorted(-(-n // self.time_multiple) * self.time_multiple for n in lengths)

  def feature_frames(self, samples: int) -> int:
    """Frames of `prepare`'s features for a segment of `samples` samples (of silence: the count depends on the
    length alone)."""
    return len(self.prepare(np.zeros(samples, np.float32))[0])

  def _window_placer(self, longest_samples: int):
    """frames -> the shortest window that holds them; past the longest window (a model without its own window,
    given audio longer than the windows were laid for), whole multiples of the longest."""
    lengths = self.window_lengths(longest_samples)

    def place(frames: int) -> int:
      for length in lengths:
        if frames <= length:
          return length
      return -(-frames // lengths[-1]) * lengths[-1]

    return place

  def rows_per_batch(self, length: int) -> int:
    """Rows of a batch of `length` frames: `batch_rows`, a multiple of the device count."""
    devices = self.runner.devices
    return max(devices, self.batch_rows(length) // devices * devices)

  def batch_rows(self, length: int) -> int:
    """Segments of `length` frames laid in one batch. On a CPU: `batch_frames` frames, and no more attention
    weights than ATTENTION_BYTES. On an accelerator whose tokenizer knows its `frame_bytes`: as many rows as
    DEVICE_MEMORY_SHARE of the device's free memory holds, activations and attention weights, at most MAX_ROWS."""
    steps = -(-length // self.attention_stride)
    attention_row = self.attention_heads * 4 * steps**2
    free = self.runner.free_bytes if "_runner" in self.__dict__ else None
    if free is not None and self.frame_bytes:
      return int(max(1, min(MAX_ROWS, DEVICE_MEMORY_SHARE * free // (length * self.frame_bytes + attention_row))))
    rows = self.batch_frames // length
    if self.attention_heads:
      rows = min(rows, ATTENTION_BYTES // attention_row)
    return max(1, rows)

  def _run(self, pieces: list[tuple[int, np.ndarray, int, int]], length: int, rows: int) -> np.ndarray:
    features = np.zeros((rows, length, pieces[0][1].shape[1]), np.float32)
    lengths = np.zeros((rows,), np.int32)
    for r, (_, f, _, _) in enumerate(pieces):
      features[r, : len(f)], lengths[r] = f, len(f)
    return self.runner(features, lengths)[: len(pieces)]

  def run_report(self) -> dict:
    """What this tokenizer has done: the `programs` its runner has (one per batch shape), of which `compiled` by
    XLA and `loaded` from the persistent compilation cache, in `compile_seconds`; the `audio_seconds` it tokenized
    in `seconds` (compiling included), and the waves whose remembered codes it `reused` (`remember_codes`)."""
    runner = self.__dict__.get("_runner")
    work = self.__dict__.get("_work", {"audio_seconds": 0.0, "seconds": 0.0, "reused": 0})
    return {"programs": len(runner.programs) if runner else 0, "compiled": runner.compiled if runner else 0,
            "loaded": runner.loaded if runner else 0,
            "compile_seconds": round(runner.compile_seconds, 2) if runner else 0.0,
            "audio_seconds": round(work["audio_seconds"], 2), "seconds": round(work["seconds"], 2),
            "reused": work["reused"]}

  @property
  def runner(self) -> "_Runner":
    if "_runner" not in self.__dict__:
      self.__dict__["_runner"] = _Runner(self)
    return self.__dict__["_runner"]


def gather_codes(mine: list[np.ndarray], count: int, codebooks: int) -> list[np.ndarray]:
  """Every process's codes of its share (`items[process_index::process_count]`) given to every process: the codes
  of all `count` items, in their order. Two all-gathers: the frame counts, then the codes laid end to end."""
  import jax
  from jax.experimental import multihost_utils

  processes = jax.process_count()
  per = -(-count // processes)
  frames = np.zeros(per, np.int32)
  frames[: len(mine)] = [len(c) for c in mine]
  every_frames = np.asarray(multihost_utils.process_allgather(frames))  # [processes, per]
  laid = np.zeros((max(1, int(every_frames.sum(1).max())), codebooks), np.int32)
  if mine:
    joined = np.concatenate(mine)
    laid[: len(joined)] = joined
  every = np.asarray(multihost_utils.process_allgather(laid))  # [processes, longest, codebooks]
  out: list[np.ndarray | None] = [None] * count
  for process in range(processes):
    ends = np.cumsum(every_frames[process])
    for k, index in enumerate(range(process, count, processes)):
      out[index] = every[process, ends[k] - every_frames[process, k]: ends[k]]
  return out


def compile_line(report: dict, policy: str) -> str:
  """One line of what JAX tokenizers compiled (`JaxAudioTokenizer.run_report`), for a command's summary."""
  return (f"compiled {report['compiled']} tokenizer programs in {report['compile_seconds']:,.1f}s, "
          f"{report['loaded']} loaded from the compilation cache ({report['programs']} shapes, {policy})")


def jax_part(tokenizer: AudioTokenizer) -> JaxAudioTokenizer | None:
  """The JAX tokenizer that computes `tokenizer`'s codes: itself, or the code tokenizer a composite one holds as
  `codes` (kimi_audio); None for one that runs no JAX program (mel_kmeans, precomputed)."""
  for candidate in (tokenizer, getattr(tokenizer, "codes", None)):
    if isinstance(candidate, JaxAudioTokenizer):
      return candidate
  return None


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


CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # JAX's event for a program read from the persistent cache


class _Runner:
  """The tokenizer's `apply` compiled once per batch shape over a data-parallel mesh, its weights placed once on
  every device; counts the programs it compiled and those the persistent compilation cache gave it."""

  def __init__(self, tokenizer: JaxAudioTokenizer):
    # jax (and s2sjax.runtime.sharding, which imports it) loads once a tokenizer runs, not when a build merely names one
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from s2sjax.runtime import cache
    from s2sjax.runtime.sharding import MeshError, make_mesh

    cache.when_jax_loads()
    mesh = make_mesh(tokenizer.mesh_spec, jax.local_devices())
    if any(mesh.shape[axis] > 1 for axis in mesh.axis_names if axis != "data"):
      raise MeshError(f"--mesh {tokenizer.mesh_spec}: audio tokenizers split batches only (data axis)")
    self.devices = mesh.shape["data"]
    self.processes = (jax.process_count(), jax.process_index())
    device = mesh.devices.flat[0]
    self.platform = device.platform
    dtype = jnp.dtype(tokenizer.dtype)
    self.dtype = dtype
    # host arrays straight to device_put (a jnp array first would be a second copy while the first is placed)
    cast = lambda x: np.asarray(x).astype(dtype, copy=False) if np.issubdtype(np.asarray(x).dtype, np.floating) \
        else np.asarray(x)
    replicated = NamedSharding(mesh, PartitionSpec())
    if self.platform == "cpu":
      # XLA:CPU reads a 64-byte-aligned host array in place and copies any other: with aligned weights the host
      # copy and the placed one are one copy, not two (1.3 GB for GLM-4-Voice's encoder)
      tokenizer.params = jax.tree_util.tree_map(aligned, tokenizer.params)
    self.params = jax.device_put(jax.tree_util.tree_map(cast, tokenizer.params), replicated)
    self.free_bytes = _free_bytes(device) if self.platform != "cpu" else None
    self.batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    self.step = jax.jit(tokenizer.apply, out_shardings=self.batch_sharding)
    self.programs: dict[tuple[int, ...], object] = {}  # batch shape -> its compiled program
    self.compiled = self.loaded = 0
    self.compile_seconds = 0.0

  def __call__(self, features: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    import jax

    features = jax.device_put(features.astype(self.dtype), self.batch_sharding)
    lengths = jax.device_put(lengths, self.batch_sharding)
    if features.shape not in self.programs:
      self.programs[features.shape] = self._compile(features, lengths)
    return np.asarray(self.programs[features.shape](self.params, features, lengths))

  def _compile(self, features, lengths):
    import jax

    hits = [0]

    def listen(event: str, **kwargs) -> None:
      if event == CACHE_HIT_EVENT:
        hits[0] += 1

    start = time.time()
    jax.monitoring.register_event_listener(listen)
    try:
      program = self.step.lower(self.params, features, lengths).compile()
    finally:
      jax.monitoring.unregister_event_listener(listen)
    self.compile_seconds += time.time() - start
    if hits[0]:
      self.loaded += 1
    else:
      self.compiled += 1
    return program


def _free_bytes(device) -> int | None:
  """Bytes the device can still allocate (its limit less what is in use), None where it does not say."""
  stats = device.memory_stats() or {}
  if "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
