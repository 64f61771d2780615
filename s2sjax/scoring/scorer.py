"""The sharded scoring step: packed rows in, per-candidate summed NLL and token counts out.

`hidden = decoder(tokens, positions, mask)`; gather `hidden[target_pos]`; apply the head there only (in chunks of
targets, so `[L, vocab]` logits are never built); fp32 `logsumexp - logit[target]` per target. `Scorer` sums a
candidate's targets on the host in float64, in its tokens' order: its sum then depends on its own tokens only,
not on where its row puts them or on what else the row holds (an fp32 sum in the step rounds as the table's
layout groups it).

`Scorer` jits that step once per row shape over a device mesh. On many hosts every process packs the same rows,
takes every P-th one, pads to an equal step count with empty rows, and checks that shapes and counts agree before
the first step (a mismatch raises on every process rather than hanging). Results are replicated, so every process
ends with all rows' numbers and process 0 can write them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import time
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from s2sjax.runtime import cli, sharding
from s2sjax.runtime.errors import UserError
from s2sjax.model.attention import (FLASH_IMPLEMENTATIONS, LOCAL_BLOCK, LocalWindow, gathered_windows, local_window,
  local_window_mask, packed_attention_mask)
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Decoder, Params, abstract_params, param_logical_axes
from s2sjax.data.packing import NEIGHBOUR_FREE_ALIGN, RowShape, empty_rows, longest_item, neighbour_free_bound
from s2sjax.runtime.progress import Progress
from s2sjax.data.rows import STREAM_ROWS, TOKEN_ROWS, RowFormat


class ScoringError(UserError, ValueError):
  """Rows that do not fit the model or the kernel asked for, or that differ between processes."""


def score_batch(
  config: ModelConfig, dtype, target_chunk: int, num_slots: int, params: Params, batch: dict, attention: str = "xla",
  window: LocalWindow | None = None, features: jax.Array | None = None, continuous: jax.Array | None = None,
  target_details: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
) -> dict:
  """For one batch of packed rows, per target [B, M]: `target_nll` and `target_missed`, whether the target is not
  the argmax of the logits that predict it (lm-eval's is_greedy, `not_greedy`: compares beside the logsumexp's pass);
  and per slot [B, C] in fp32 (a training loop's loss; `Scorer` sums the targets itself, `slot_sums`): `nll_sum`,
  `n_tokens` and `greedy_misses`. Pure; jitted by `Scorer`. With a `window`, attention is item-local: its window
  mask (and with `key_shift` in the batch, neighbour-free rows' shared roots, where each window's keys are read:
  `gathered_windows`) is built once for all layers, and no [L, L] mask. `features` [B, L, D] replace the
  token embeddings where `continuous` [B, L] is set (`Decoder`'s audio encoder rows: Step-Audio 2's).
  `target_details(logits [..., V], ids [...]) -> [..., D]`: an architecture's further per-target numbers, read from
  the same logits (`target_details` [B, M, D]: its `Architecture.details`)."""
  model = Decoder(config, dtype=dtype, attention=attention, attention_window=window)
  if window and "key_shift" in batch:
    mask = gathered_windows(batch["segment_ids"], batch["branch_ids"], batch["key_shift"], window)
  elif window:
    mask = local_window_mask(batch["segment_ids"], batch["branch_ids"], window)
  else:
    mask = packed_attention_mask(batch["segment_ids"], batch["branch_ids"])
  hidden = model.apply({"params": params}, batch["tokens"], batch["positions"], mask, batch["audio_codes"],
                       batch["segment_ids"], batch["branch_ids"], features, continuous)
  hidden = jnp.take_along_axis(hidden, batch["target_pos"][..., None], axis=1)  # [B, M, D]

  def target_nll(h, ids):
    logits = model.apply({"params": params}, h, method=Decoder.logits)  # fp32 [B, chunk, V]
    nll, missed = nll_and_missed(logits, ids)
    return (nll, missed) if target_details is None else (nll, missed, target_details(logits, ids))

  nll, missed, *details = by_target_chunks(target_nll, target_chunk, hidden, batch["target_ids"])

  slots = batch["target_slot"]
  onehot = (slots[..., None] == jnp.arange(num_slots)).astype(jnp.float32)  # [B, M, C]; slot -1 matches none
  return {
    "target_nll": nll, "target_missed": missed,
    "nll_sum": jnp.einsum("bm,bmc->bc", nll, onehot, precision=jax.lax.Precision.HIGHEST),
    "n_tokens": onehot.sum(axis=1).astype(jnp.int32),
    "greedy_misses": (missed[..., None] & (onehot > 0)).sum(axis=1, dtype=jnp.int32),  # a count: no matmul
    **({"target_details": details[0]} if details else {}),
  }


def nll_and_missed(logits: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per target [...]: fp32 `logsumexp - logit[target]` and `not_greedy`, from its logits [..., V]."""
  picked = jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]
  return jax.nn.logsumexp(logits, axis=-1) - picked, not_greedy(logits, ids, picked)


def not_greedy(logits: jax.Array, ids: jax.Array, picked: jax.Array) -> jax.Array:
  """[...]: whether each target id is not the argmax of its logits [..., V] (the first of equal ones, as
  jnp.argmax on finite logits): a logit above the target's `picked`, or an equal one before it. XLA:CPU fuses
  these compares into one pass beside the logsumexp's, where its argmax is a two-operand reduce of its own:
  `python -m s2sjax.benchmarks.head` measured the head 1.03x (Qwen2.5-0.5B) to 1.6x (hidden 32 over Qwen2.5's
  vocabulary) faster."""
  index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  above = logits > picked[..., None]
  tied_before = (logits == picked[..., None]) & (index < ids[..., None])
  return jnp.any(above | tied_before, axis=-1)


# What the Scorer's step returns per target, and the per-slot sum `slot_sums` makes of each: `target_details`
# [B, M, D] are an architecture's further numbers (its `Architecture.details`), summed per slot as the NLL is.
TARGET_OUTPUTS = {"target_nll": "nll_sum", "target_missed": "greedy_misses", "target_details": "details"}


def slot_sums(rows: dict[str, np.ndarray], per_target: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Per slot [R, C] of the rows: `n_tokens`, and each per-target output [R, M] (or [R, M, D], column by column)
  summed over the slot's targets in float64 (`TARGET_OUTPUTS` names the sums), one target after another in table
  order: a candidate's targets are its tokens in order, so its sum is the same bits wherever it lies."""
  slot = rows["target_slot"]
  num_rows, width = rows["slot_item"].shape
  used = slot >= 0
  flat = (np.arange(num_rows)[:, None] * width + slot)[used]
  sums = {"n_tokens": np.bincount(flat, minlength=num_rows * width).reshape(num_rows, width)}
  for name, value in per_target.items():
    picked = value[:, : slot.shape[1]][used].astype(np.float64)  # [targets] or [targets, D]
    columns = [np.bincount(flat, weights=column, minlength=num_rows * width).reshape(num_rows, width)
               for column in (picked.T if picked.ndim == 2 else [picked])]
    sums[TARGET_OUTPUTS[name]] = np.stack(columns, axis=-1) if picked.ndim == 2 else columns[0]
  if "greedy_misses" in sums:
    sums["greedy_misses"] = sums["greedy_misses"].astype(np.int64)
  return sums


def by_target_chunks(fn: Callable, target_chunk: int, *arrays: jax.Array):
  """`fn` over the targets of [B, M, ...] arrays in chunks of at most `target_chunk`, one chunk after another
  (`lax.map`: only one chunk's logits exist at a time); its [B, chunk] outputs merged back to [B, M]. The chunks
  are as even as their count allows: M = 320 is two of 160, not two of 256 half padding."""
  batch_size, num_targets = arrays[0].shape[:2]
  count = -(-num_targets // target_chunk)
  chunk = -(-num_targets // count)
  pad = count * chunk - num_targets
  split = lambda x: jnp.moveaxis(jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
                                 .reshape(batch_size, count, chunk, *x.shape[2:]), 1, 0)
  merge = lambda x: jnp.moveaxis(x, 0, 1).reshape(batch_size, count * chunk, *x.shape[3:])[:, :num_targets]
  return jax.tree.map(merge, jax.lax.map(lambda chunks: fn(*chunks), tuple(map(split, arrays))))


def check_ids(rows: dict[str, np.ndarray], config: ModelConfig) -> None:
  """Ids beyond the embedding tables would be clamped silently by the gather: refuse them, naming the row."""
  for field in ("tokens", "target_ids"):
    bad = np.argwhere((rows[field] >= config.vocab_size) | (rows[field] < 0))
    if len(bad):
      r, pos = bad[0]
      raise ScoringError(
        f"{field}[row {r}, position {pos}] = {rows[field][r, pos]} is outside the embedding table "
        f"({config.vocab_size} rows); {len(bad)} such ids in all — was the data built for another tokenizer?"
      )
  codes = rows["audio_codes"]
  if codes.shape[-1] == 0:
    return  # text rows
  if codes.shape[-1] != len(config.audio_codebook_sizes):
    raise ScoringError(f"rows carry {codes.shape[-1]} audio codebooks, the model has "
                       f"{len(config.audio_codebook_sizes)}")
  for k, size in enumerate(config.audio_codebook_sizes):
    bad = np.argwhere(codes[..., k] >= size)
    if len(bad):
      r, pos = bad[0]
      raise ScoringError(f"audio_codes[row {r}, position {pos}, codebook {k}] = {codes[r, pos, k]} >= table size "
                         f"{size}")


def _misaligned_item(segment_ids: np.ndarray, align: int) -> tuple[int, int] | None:
  """(row, position) of the first segment of rows [R, L] that does not start at a multiple of `align`, or None."""
  starts = (segment_ids > 0) & (segment_ids != np.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1])
  bad = np.argwhere(starts & (np.arange(segment_ids.shape[1]) % align != 0))
  return (int(bad[0][0]), int(bad[0][1])) if len(bad) else None


def _has_shared_prefixes(rows: dict[str, np.ndarray]) -> bool:
  """Whether any segment holds two candidate branches (a mask that segment ids alone cannot express)."""
  for segments, branches in zip(rows["segment_ids"], rows["branch_ids"]):
    pairs = np.unique(np.stack([segments, branches])[:, branches > 0], axis=1)
    if len(np.unique(pairs[0])) < pairs.shape[1]:
      return True
  return False


def _check_batch_shards_have_one_process(batch_sharding: NamedSharding, batch_size: int) -> None:
  """Every process feeds its own rows, so no batch shard may span two processes: a model axis across hosts, or
  data x fsdp smaller than the process count, would silently mix different rows into one replicated shard."""
  owners: dict[int, set[int]] = {}
  for device, index in batch_sharding.devices_indices_map((batch_size,)).items():
    owners.setdefault(index[0].start or 0, set()).add(device.process_index)
  shared = sorted(start for start, processes in owners.items() if len(processes) > 1)
  if shared:
    raise sharding.MeshError(
      f"mesh {dict(batch_sharding.mesh.shape)} puts a batch shard on devices of {len(owners[shared[0]])} processes: give data x fsdp "
      f"a multiple of the {jax.process_count()} processes and keep the model axis within a host "
      "(e.g. --mesh=data:-1,model:N with N at most the devices per host)"
    )


# Targets whose logits one head chunk computes at once (`by_target_chunks`). On an accelerator, 256 per row keep the
# matrix units busy. On a CPU the chunk is cut so that each device computes the logits of CPU_HEAD_ROWS targets at
# a time, a block that stays near its caches: on a 2-core CPU the head of the tests' tiny 151,680-id model ran 2.7x
# faster than with 256 targets of 4 rows, SmolLM2's head (576 x 49,152) 1.3x. Each device's head then reads about
# [CPU_HEAD_ROWS, D] whatever the batch size or mesh.
TARGET_CHUNK = 256
CPU_HEAD_ROWS = 128


def default_target_chunk(mesh: Mesh, batch_size: int) -> int:
  """`TARGET_CHUNK` on an accelerator; on a CPU, CPU_HEAD_ROWS target rows per device split over its batch rows."""
  if mesh.devices.flat[0].platform != "cpu":
    return TARGET_CHUNK
  rows_per_device = math.ceil(batch_size / (mesh.shape["data"] * mesh.shape["fsdp"]))
  return max(1, CPU_HEAD_ROWS // rows_per_device)


class _RowScorer:
  """What both scorers share: one row format's step, jitted over a mesh with batches a multiple of the
  data-parallel devices, and the multi-host driver that feeds it (module docstring). A subclass supplies the
  format's parameter shardings, batch fields, padding rows and per-batch scoring function."""

  def __init__(self, config, shape: RowShape, mesh: Mesh | None, batch_size: int, param_axes, abstract,
               fields: tuple[str, ...], ndim: dict[str, int], empty: Callable[[int, dict], dict],
               score: Callable[[int, Params, dict], dict], target_chunk: int | None = None):
    """fields: the step's batch fields, `row_id` among them; ndim: those that are not [B, L] or [B, M];
    empty(count, rows): `count` padding rows of the format (and of `rows`' stream count, where it has one);
    score(target_chunk, params, batch): the format's step; target_chunk None: `default_target_chunk`.
    param_axes None: parameters are placed by their owner (a training loop's own model) and used where they are."""
    self.config, self.shape, self._fields, self._empty = config, shape, fields, empty
    self.mesh = mesh or sharding.make_mesh()
    data_parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    # Every step's batch is a multiple of the data-parallel devices (and so of the processes).
    self.batch_size = math.ceil(batch_size / data_parallel) * data_parallel
    self.local_batch = self.batch_size // jax.process_count()
    self.target_chunk = target_chunk or default_target_chunk(self.mesh, self.batch_size)
    self.param_shardings = (None if param_axes is None
                            else sharding.logical_to_sharding(param_axes, abstract, self.mesh))
    batch_spec = lambda ndim: NamedSharding(self.mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))
    ndim = {"row_id": 1, **ndim}
    self._batch_shardings = {name: batch_spec(ndim.get(name, 2)) for name in fields}
    _check_batch_shards_have_one_process(self._batch_shardings["row_id"], self.batch_size)

    def step(params, batch):  # per target only (`slot_sums`); row ids ride along so every process can place them
      out = score(self.target_chunk, params, batch)
      return {**{name: out[name] for name in TARGET_OUTPUTS if name in out}, "row_id": batch["row_id"]}

    # where the last `_score_rows` spent its time (seconds): host (batches laid and results placed on the host),
    # to_device, compile (JAX's own compile events, timed inside the first step of a shape), step, from_device
    self.seconds: collections.Counter = collections.Counter()
    self._step = jax.jit(
      step,
      in_shardings=None if self.param_shardings is None else (self.param_shardings, self._batch_shardings),
      out_shardings=sharding.replicated(self.mesh),
    )

  @contextlib.contextmanager
  def _mesh_context(self):
    """What the step is traced under: the mesh (jax.set_mesh, which the decoder's activation constraints and the
    flash kernel's shard_map read; the deprecated `with mesh:` reaches neither) and the logical axis rules."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(sharding.LOGICAL_RULES):
      yield

  def compiled_count(self) -> int:
    """How many times the step has been compiled (one per row shape)."""
    return self._step._cache_size()

  @property
  def step_identity(self) -> str:
    """What of the compiled step changes a chunk's bits beyond the model and the rows (chunks of another step are
    scored again, never mixed): an architecture's own step reads every key of the row."""
    return "streams window None"

  def _agree_across_processes(self, num_rows: int) -> None:
    mine = np.array([num_rows, self.shape.length, self.shape.max_targets, self.shape.max_slots,
                     self.shape.num_codebooks, self.batch_size], np.int64)
    if jax.process_count() == 1:
      return
    everyone = np.asarray(multihost_utils.process_allgather(mine))
    if not (everyone == mine).all():
      raise ScoringError(
        "processes disagree on (rows, L, M, C, K, batch): "
        + "; ".join(f"process {p}: {tuple(v)}" for p, v in enumerate(everyone))
      )

  def _check_widths(self, rows: dict[str, np.ndarray]) -> None:
    """The step reads rows of its length and codebooks whose target tables are at most its own (narrower ones,
    fitted to other rows by packing.fit, are padded per step); anything else would fail in numpy's broadcast or
    lose targets silently: name the field and both shapes."""
    want = self._empty(0, rows)
    for name in (name for name in self._fields if name != "row_id"):
      have, fits = rows[name].shape[1:], want[name].shape[1:]
      if not (have[1:] == fits[1:] and (have[0] <= fits[0] if name.startswith("target_")
                                                              else have[0] == fits[0])):
        raise ValueError(f"rows' {name} is {list(rows[name].shape)}, the step's {self.shape} reads "
                         f"[rows, {', '.join(map(str, fits))}]" + (" or narrower" if name.startswith("target_") else "")
                         + ": score rows with a shape that holds them (packing.fit, packing.spanning)")
    if rows["target_slot"].max(initial=-1) >= self.shape.max_slots:  # the step's one-hot would drop those targets
      raise ValueError(f"rows score candidate slot {rows['target_slot'].max()}, beyond the {self.shape.max_slots} "
                       f"slots of the step's {self.shape}")

  def _score_rows(self, params: Params, rows: dict[str, np.ndarray], progress: bool) -> dict[str, np.ndarray]:
    """Scores all rows (the same full set on every process, already checked); returns per slot [R, the rows' C]
    n_tokens and the sums of the step's per-target outputs (`slot_sums`: nll_sum, greedy_misses, details)."""
    num_rows = len(rows["segment_ids"])
    self._check_widths(rows)
    self._agree_across_processes(num_rows)
    self.seconds = collections.Counter()
    if self.param_shardings is not None:
      start = time.perf_counter()
      params = jax.block_until_ready(jax.device_put(params, self.param_shardings))
      self.seconds["to_device"] += time.perf_counter() - start
    count, index = jax.process_count(), jax.process_index()
    mine = np.arange(index, num_rows, count)
    steps = math.ceil(math.ceil(num_rows / count) / self.local_batch)
    targets = rows["target_slot"].shape[1]  # the rows' own table: a wider step's further targets score nothing
    per_target: dict[str, np.ndarray] = {}
    meter = Progress(num_rows) if progress else None
    for step in range(steps):
      start = time.perf_counter()
      local = self._local_batch(rows, mine[step * self.local_batch : (step + 1) * self.local_batch])
      self.seconds["host"] += time.perf_counter() - start
      out = cli.in_worker(self._run_step, params, local)  # Ctrl-C stops the command mid-step (s2sjax/runtime/cli.py)
      start = time.perf_counter()
      row_id = out["row_id"]
      real = row_id >= 0
      for name, value in out.items():
        if name != "row_id":
          value = value[real, :targets]
          held = per_target.setdefault(name, np.zeros((num_rows, targets) + value.shape[2:], value.dtype))
          held[row_id[real]] = value
      if meter:
        meter.update(int(real.sum()), int((rows["segment_ids"][row_id[real]] > 0).sum()))
      self.seconds["host"] += time.perf_counter() - start
    start = time.perf_counter()
    sums = slot_sums(rows, per_target)
    self.seconds["host"] += time.perf_counter() - start
    return sums

  def _run_step(self, params: Params, local: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One step over this process's part of a batch; its outputs (replicated) as this process's host arrays. Its
    phases are added to `seconds` (a compile, which JAX runs inside the step's call, out of the step's time)."""
    with self._mesh_context(), _compile_seconds() as compiled:
      start = time.perf_counter()
      batch = jax.block_until_ready(self._globalize(local))
      dispatched = time.perf_counter()
      out = jax.block_until_ready(self._step(params, batch))
      done = time.perf_counter()
      host = {name: np.asarray(value.addressable_data(0)) for name, value in out.items()}
    self.seconds["to_device"] += dispatched - start
    self.seconds["compile"] += compiled[0]
    self.seconds["step"] += done - dispatched - compiled[0]
    self.seconds["from_device"] += time.perf_counter() - done
    return host

  def _local_batch(self, rows: dict[str, np.ndarray], indices: np.ndarray) -> dict[str, np.ndarray]:
    """This process's part of a step: the rows at `indices`, then padding rows (row id -1) that score nothing."""
    batch = self._empty(self.local_batch, rows)
    batch["row_id"] = np.full(self.local_batch, -1, np.int32)
    for name in self._fields:
      if name == "row_id":
        batch[name][: len(indices)] = indices
      else:  # a narrower target table fills the step's from the left; the rest stays padding
        batch[name][: len(indices), : rows[name].shape[1]] = rows[name][indices]
    return {name: batch[name] for name in self._fields}

  def _globalize(self, local: dict[str, np.ndarray]) -> dict:
    return {
      name: jax.make_array_from_process_local_data(self._batch_shardings[name], value)
      for name, value in local.items()
    }


# JAX's events for the phases of a compile (tracing, lowering, XLA's compile or a persistent-cache read)
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


@contextlib.contextmanager
def _compile_seconds():
  """Seconds JAX spends compiling within the block (its monitoring events), as a one-element list."""
  total = [0.0]

  def listen(event: str, duration: float, **kwargs) -> None:
    if event in COMPILE_EVENTS:
      total[0] += duration

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield total
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


class Scorer(_RowScorer):
  """A compiled scoring step for one model config, row shape, mesh and batch size; reusable across params."""

  def __init__(
    self,
    config: ModelConfig,
    shape: RowShape,
    mesh: Mesh | None = None,
    batch_size: int = 8,
    dtype=jnp.float32,
    target_chunk: int | None = None,
    attention: str = "xla",
    local_attention: bool = True,
    neighbour_free: bool = False,
  ):
    """attention: xla | dot_product | cudnn | flash | flash_shared (see model/attention.masked_attention); flash needs
    rows without sharing, flash_shared takes any.
    local_attention: with xla, dot_product or cudnn and a shape that records its longest item (`RowShape.max_item`),
    each query block attends over its item's key window only (model/attention.local_attention); False, or a shape
    without the record, keeps the dense [L, L] mask (the reference).
    neighbour_free: rows packed with `align=packing.NEIGHBOUR_FREE_ALIGN` score every candidate to the same bits
    whatever shares its row and whatever the run's longest item: item-local windows always (as wide as the row if
    need be), on `packing.neighbour_free_bound`'s ladder of reaches, and rows with shared roots (their `key_shift`,
    packing.SharedRoot) as if each item were laid alone; xla attention only."""
    self.attention = attention
    local = local_attention and attention not in FLASH_IMPLEMENTATIONS
    self.window = local_window(shape.max_item, shape.length) if local else None
    self.neighbour_free = neighbour_free
    if neighbour_free:
      if not (local and shape.max_item > 0 and shape.length % NEIGHBOUR_FREE_ALIGN == 0):
        raise ValueError(f"neighbour_free scoring needs item-local attention (xla, dot_product or cudnn) and a shape "
                         f"that records its longest item in rows of a multiple of {NEIGHBOUR_FREE_ALIGN}, not {shape}")
      self.window = LocalWindow(LOCAL_BLOCK, neighbour_free_bound(shape.max_item) - 1)
    score = lambda chunk, params, batch: score_batch(config, dtype, chunk, shape.max_slots, params, batch, attention,
                                                     self.window)
    # neighbour-free steps read where shared roots' items lie (`key_shift`, 0 in rows without them)
    shifted = ("key_shift",) if neighbour_free else ()
    super().__init__(config, shape, mesh, batch_size, param_logical_axes(config), abstract_params(config),
                     TOKEN_ROWS.step_fields + shifted, {name: 3 for name in TOKEN_ROWS.wide},
                     lambda count, rows: self._with_shift(empty_rows(count, shape)), score, target_chunk)

  def _with_shift(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows as the step reads them: neighbour-free rows with a `key_shift` (zeros where the packer laid no shared
    root); other steps read none."""
    if not self.neighbour_free or "key_shift" in rows:
      return rows
    return {**rows, "key_shift": np.zeros_like(rows["segment_ids"])}

  @property
  def step_identity(self) -> str:
    """The attention kernel and its item-local window, which spans the longest item of every task sharing the step
    (so T->T run beside S->T is scored by another program than T->T alone, ~1e-6 nats apart)."""
    return f"{self.attention} window {self.window}"

  def lower_abstract(self, param_dtype=jnp.float32, platforms: tuple[str, ...] | None = None) -> jax.stages.Lowered:
    """The step lowered for this scorer's batch and parameters of `param_dtype`, without allocating either:
    `.compile().memory_analysis()` tells whether a model fits before any weights are loaded. `platforms` lowers
    for another backend (("tpu",) from a CPU host: whether the TPU kernels partition over the mesh)."""
    local = self._local_batch(self._with_shift(empty_rows(0, self.shape)), np.arange(0))
    batch = {name: jax.ShapeDtypeStruct((self.batch_size, *value.shape[1:]), value.dtype,
                                        sharding=self._batch_shardings[name]) for name, value in local.items()}
    params = jax.tree.map(lambda leaf, where: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where),
                          abstract_params(self.config, param_dtype), self.param_shardings)
    with self._mesh_context():
      return self._step.trace(params, batch).lower(lowering_platforms=platforms)

  def score(self, params: Params, rows: dict[str, np.ndarray], progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Scores all packed rows (the same full set on every process); returns (nll_sum, n_tokens) [R, C]."""
    slots = self.score_slots(params, rows, progress)
    return slots["nll_sum"], slots["n_tokens"]

  def score_slots(self, params: Params, rows: dict[str, np.ndarray], progress: bool = True) -> dict[str, np.ndarray]:
    """As `score`, with every per-slot output of the step (`score_batch`): greedy_misses too."""
    check_ids(rows, self.config)
    if self.attention == "flash" and _has_shared_prefixes(rows):
      raise ScoringError("flash attention cannot express prefix-shared branches: use --attention=flash_shared, "
                         "build the rows without sharing (--noshare_prefix, configs ending in -noshare) or use "
                         "--attention=xla")
    if self.neighbour_free and (misplaced := _misaligned_item(rows["segment_ids"], NEIGHBOUR_FREE_ALIGN)):
      raise ValueError(f"neighbour_free scoring reads rows whose items start at multiples of {NEIGHBOUR_FREE_ALIGN}: "
                       f"row {misplaced[0]} starts one at {misplaced[1]} (pack them with align={NEIGHBOUR_FREE_ALIGN})")
    if "key_shift" in rows and not self.neighbour_free:
      raise ValueError("rows with shared roots (key_shift) are scored neighbour-free (Scorer(neighbour_free=True))")
    rows = self._with_shift(rows)
    longest = longest_item(rows["segment_ids"], rows.get("key_shift"))
    if self.window and longest > self.shape.max_item:
      raise ValueError(f"the rows hold an item of {longest} tokens, beyond the {self.shape.max_item} their shape "
                       "records: item-local attention would drop keys (pack them with this shape, or score with "
                       "local_attention=False)")
    return self._score_rows(params, rows, progress)


@dataclasses.dataclass
class CandidateScores:
  """Per (item, candidate): summed NLL over the candidate's tokens and their count; [N, max candidates], NaN/0
  where an item has fewer candidates."""

  nll_sum: np.ndarray
  n_tokens: np.ndarray
  details: np.ndarray | None = None  # [N, max candidates, D]: the architecture's details (`Architecture.details`)

  @property
  def mean_nll(self) -> np.ndarray:
    """S2SBench's loss: the mean token cross-entropy over the candidate's tokens."""
    with np.errstate(invalid="ignore", divide="ignore"):
      return self.nll_sum / self.n_tokens


def collect(rows: dict[str, np.ndarray], nll_sum: np.ndarray, n_tokens: np.ndarray,
            num_candidates: list[int] | None = None, details: np.ndarray | None = None) -> CandidateScores:
  """Maps per-row slot results [R, C] (`details` [R, C, D]) back to (item, candidate). Every candidate laid in the
  rows is scored exactly once; `num_candidates` (per item), when given, must match what the rows hold."""
  used = rows["slot_item"] >= 0
  item, cand = rows["slot_item"][used], rows["slot_candidate"][used]
  if num_candidates is None:
    num_candidates = np.zeros(item.max() + 1, np.int64)
    np.maximum.at(num_candidates, item, cand + 1)
  num_candidates = np.asarray(num_candidates)
  beyond = (item >= len(num_candidates)) | (cand >= num_candidates[np.minimum(item, len(num_candidates) - 1)])
  if beyond.any():
    i, c = item[beyond][0], cand[beyond][0]
    raise ValueError(f"the packed rows hold item {i} candidate {c}, beyond the {len(num_candidates)} items and "
                     "their candidates expected (rows of other data?)")
  items, width = len(num_candidates), int(num_candidates.max())
  total = np.full((items, width), np.nan)
  count = np.zeros((items, width), np.int64)
  seen = np.zeros((items, width), np.int64)
  total[item, cand] = nll_sum[used]
  count[item, cand] = n_tokens[used]
  np.add.at(seen, (item, cand), 1)
  expected = np.arange(width)[None, :] < num_candidates[:, None]
  wrong = np.argwhere(seen != expected)
  if len(wrong):
    listed = ", ".join(f"item {i} candidate {c} laid {seen[i, c]}x" for i, c in wrong[:5])
    raise ValueError(f"the packed rows do not hold every candidate exactly once: {listed}"
                     + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""))
  per_item = None
  if details is not None:
    per_item = np.full((items, width, details.shape[-1]), np.nan)
    per_item[item, cand] = details[used]
  return CandidateScores(total, count, per_item)


# ---- Rows of an architecture's own format ---------------------------------------------------------------------------
#
# The same driver for rows of another format: parallel streams (s2sjax/data/formats/streams.py, where a target is one
# predicted step, its tokens weighted per stream by `target_weight`, so `n_tokens` counts a candidate's steps) or a
# plugin's (tests/plugins/toy_features.py). The step itself is the architecture's (its model, its heads):
# `score_batch(config, dtype, target_chunk, num_slots, params, batch)` returns per target `target_nll` and per slot
# `nll_sum` and `n_tokens`, as `score_batch` above; `check_ids(rows, config)` refuses ids beyond the model's tables.


class StreamScorer(_RowScorer):
  """`Scorer` for rows of an architecture's own format (stream rows unless `row_format` says otherwise): one
  compiled step per row shape (and width) over a mesh, rows split over processes; the model's step, id check and
  parameter tree come from its architecture."""

  def __init__(self, config, shape: RowShape, score_batch: Callable, check_ids: Callable, abstract: Params,
               param_axes: Params, mesh: Mesh | None = None, batch_size: int = 8, dtype=jnp.float32,
               target_chunk: int | None = None, row_format: RowFormat = STREAM_ROWS):
    score = lambda chunk, params, batch: score_batch(config, dtype, chunk, shape.max_slots, params, batch)
    empty = lambda count, rows: row_format.empty(count, shape, row_format.widths_of(rows))
    super().__init__(config, shape, mesh, batch_size, param_axes, abstract, row_format.step_fields,
                     {name: 3 for name in row_format.wide}, empty, score, target_chunk)
    self._check_ids = check_ids

  def score(self, params: Params, rows: dict[str, np.ndarray], progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Scores all rows (the same full set on every process); returns (nll_sum, n_tokens) [R, C]."""
    slots = self.score_slots(params, rows, progress)
    return slots["nll_sum"], slots["n_tokens"]

  def score_slots(self, params: Params, rows: dict[str, np.ndarray], progress: bool = True) -> dict[str, np.ndarray]:
    """As `score`, with every per-slot output of the step: `details` [R, C, D] too where the step gives them."""
    self._check_ids(rows, self.config)
    return self._score_rows(params, rows, progress)


def row_mask(batch: dict, window: LocalWindow | None):
  """The decoder's mask of packed rows over their segment and branch ids: item-local with a `window`, else dense."""
  if window:
    return local_window_mask(batch["segment_ids"], batch["branch_ids"], window)
  return packed_attention_mask(batch["segment_ids"], batch["branch_ids"])


def text_head_scores(logits: Callable, hidden: jax.Array, batch: dict, target_chunk: int, num_slots: int) -> dict:
  """What an own-rows step returns for one-id targets under a text head: per target [B, M] `target_nll` (the
  target id's NLL over the full vocabulary of `logits(h)`, fp32 logsumexp, read at `target_pos` of hidden
  [B, L, H]) and per slot [B, C] `nll_sum` and `n_tokens`."""
  gathered = jnp.take_along_axis(hidden, batch["target_pos"][..., None], axis=1)

  def nll_of(h, ids):
    scores = logits(h)
    return jax.nn.logsumexp(scores, axis=-1) - jnp.take_along_axis(scores, ids[..., None], axis=-1)[..., 0]

  return slot_scores(by_target_chunks(nll_of, target_chunk, gathered, batch["target_ids"]), batch, num_slots)


def slot_scores(nll: jax.Array, batch: dict, num_slots: int) -> dict:
  """Per target [B, M] NLLs -> what an own-rows step returns: `target_nll` and per slot [B, C] `nll_sum` and
  `n_tokens` (targets of the slot)."""
  onehot = (batch["target_slot"][..., None] == jnp.arange(num_slots)).astype(jnp.float32)
  return {"target_nll": nll, "nll_sum": jnp.einsum("bm,bmc->bc", nll, onehot, precision=jax.lax.Precision.HIGHEST),
          "n_tokens": onehot.sum(axis=1).astype(jnp.int32)}


def windowed_scorer(config, shape: RowShape, score_batch: Callable, check_ids: Callable, abstract: Params,
                    param_axes: Params, row_format: RowFormat, mesh: Mesh | None = None, batch_size: int = 8,
                    dtype=jnp.float32, attention: str = "xla") -> StreamScorer:
  """A `StreamScorer` over an architecture's own rows whose step, `score_batch(config, dtype, target_chunk,
  num_slots, params, batch, attention, window)`, attends item-locally where the shape records its longest item."""
  window = local_window(shape.max_item, shape.length)
  step = lambda config, dtype, target_chunk, num_slots, params, batch: score_batch(
    config, dtype, target_chunk, num_slots, params, batch, attention, window)
  return StreamScorer(config, shape, step, check_ids, abstract, param_axes, mesh=mesh, batch_size=batch_size,
                      dtype=dtype, row_format=row_format)
