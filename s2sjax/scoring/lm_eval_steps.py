"""How the lm-eval backend (s2sjax/commands/lm_eval.py) lays and steps a call's requests: the contexts that share
an opening laid once a row (`shared_roots`), the groups of like item windows scored apart (`by_window`), the rows a
step (`rows_per_step`, `even_steps`, at least `SMALLEST_STEP` positions a device), each step's compiled shape
(`step_shape`: its window from a short ladder of reaches, `window_reach`) and the steps of one window together
(`steps_by_window`). Every window of the ladder gives an item the same bits, so none of these choices changes a
result, only what a call costs.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from s2sjax.data.packing import (NEIGHBOUR_FREE_ALIGN, ONE_LEAF_REACH, REDUCTION_PERIOD, Item, RowShape, SharedRoot,
                                 lays_shared, longest_items, neighbour_free_bound, required_length)
from s2sjax.scoring import planner


# Smaller steps run faster on a CPU: 18 rows of 1,024 (60 CMMLU-shaped contexts, SmolLM2-135M, neighbour-free) took
# 33.4 s in steps of 2 rows, 36.5 s in steps of 4 and 39.9 s in one step (2-core CPU, best of two).
CPU_ROWS_PER_DEVICE = 2


def rows_per_step(config, shape: RowShape, rows: int, mesh, dtype, max_batch_size: int, memory: int) -> int:
  """batch_size=auto: the most rows per step, a multiple of the data-parallel devices, up to max_batch_size (on
  CPUs, CPU_ROWS_PER_DEVICE a device) and the call's own rows, whose parameters and activations
  (`planner.activation_bytes`, an upper bound: it counts attention over whole rows) fit in 90% of each device's
  `memory`."""
  data_parallel, model_parallel = mesh.shape["data"] * mesh.shape["fsdp"], mesh.shape["model"]
  params = planner.param_bytes(config, jnp.dtype(dtype).name) / model_parallel
  if mesh.devices.flat[0].platform == "cpu":
    max_batch_size = min(max_batch_size, CPU_ROWS_PER_DEVICE * data_parallel)
  per_device = max(1, math.ceil(min(rows, max_batch_size) / data_parallel))
  while per_device > 1 and params + planner.activation_bytes(config, per_device, shape.length, jnp.dtype(dtype).name,
                                                           model_parallel) > 0.9 * memory:
    per_device -= 1
  return per_device * data_parallel


# XLA:CPU multiplies a matrix of a few rows by another kernel, whose sums round otherwise (SmolLM2's projections,
# 576 inputs: other bits for 32 rows or fewer than for every count tried from 33 to 1,024; Qwen2.5-0.5B's, 896: for
# 9 or fewer): a step of at least 64 positions a device keeps a request's bits whatever else its call holds.
SMALLEST_STEP = 64


def even_steps(rows: int, most: int) -> int:
  """Rows a step for `rows` at most `most` a step: as many steps as `most` needs, the rows spread evenly over them,
  since a step's padding rows cost a whole row's forward each (11 rows at 8 a step ran 16; at 6, 12)."""
  steps = -(-rows // most)
  return -(-rows // steps)


def shared_roots(items: list[Item]) -> list[SharedRoot]:
  """Groups of items whose candidates are one token each (a multiple-choice task's letters) and whose contexts open
  with the same run of tokens, cut to a multiple of NEIGHBOUR_FREE_ALIGN (at least one): a task's instructions and
  a few-shot prompt's shots, laid once a row for the questions after them (packing.SharedRoot; each question's rest
  then starts at a multiple of NEIGHBOUR_FREE_ALIGN, as an item does). Contexts in token order, so a subject's
  questions are neighbours; a group grows while the next context shares the whole of its run."""
  one_token = [i for i, item in enumerate(items) if all(len(c) == 1 for c in item.candidates)]
  one_token.sort(key=lambda i: items[i].prefix.tolist())
  roots, group, length = [], [], 0
  for index in one_token:
    if group:
      first, this = items[group[0]].prefix, items[index].prefix
      span = min(len(first), len(this))
      differ = np.flatnonzero(first[:span] != this[:span])
      run = (int(differ[0]) if len(differ) else span) // NEIGHBOUR_FREE_ALIGN * NEIGHBOUR_FREE_ALIGN
      if run and (len(group) == 1 or run >= length):
        length = run if len(group) == 1 else length
        group.append(index)
        continue
      if len(group) > 1:
        roots.append(SharedRoot(length, tuple(group)))
    group = [index]
  if len(group) > 1:
    roots.append(SharedRoot(length, tuple(group)))
  return roots


def laid_whole(roots: list[SharedRoot], items: list[Item], capacity: RowShape) -> list[SharedRoot]:
  """The roots' items that rows of `capacity` lay whole (`packing.lays_shared`: a shorter row need not), the roots
  left with two or more."""
  kept = [SharedRoot(root.length, tuple(i for i in root.items if lays_shared(items[i], capacity, True)))
          for root in roots]
  return [root for root in kept if len(root.items) > 1]


def window_reach(longest_item: int) -> int:
  """The keys an item-local window of a call whose longest item is `longest_item` reaches back: 64 x 1, 2, 3, 4, 6
  or 7, then 960, 1,984, ... (`neighbour_free_bound`'s ladder; at most a third more keys than needed up to 448), so
  that the calls of a run (and of the next, through the compilation cache) share a few compiled steps instead of
  one each."""
  power = lambda n: 1 << (max(n, 1) - 1).bit_length()
  reach = neighbour_free_bound(longest_item) - 1
  if reach > ONE_LEAF_REACH:  # past one leaf the bound's own ladder is already coarse
    return reach
  periods = reach // REDUCTION_PERIOD
  rung = power(periods)
  return min(REDUCTION_PERIOD * (rung * 3 // 4 if rung >= 4 and periods <= rung * 3 // 4 else rung), ONE_LEAF_REACH)


def step_shape(fitted: RowShape, longest_item: int) -> RowShape:
  """The compiled step's shape for rows `fit` to `fitted`: target and slot tables rounded up to a power of two (at
  least 32) and the item window `window_reach`."""
  power = lambda n: max(32, 1 << (max(n, 1) - 1).bit_length())
  return dataclasses.replace(fitted, max_targets=min(power(fitted.max_targets), fitted.length),
                             max_slots=min(power(fitted.max_slots), fitted.length),
                             max_item=window_reach(longest_item) + 1)


def by_window(items: list[Item]) -> list[list[int]]:
  """The items (indices) a call scores together: those whose windows fit one leaf of packing.REDUCTION_LEAF keys,
  and those of each longer window, each group packed in rows of its own. A long context would otherwise share its
  rows, and so its steps' window past the leaf, with short ones (CMMLU 0-shot, 144 contexts of 154 tokens on
  average: the one of 484 steps alone in a row of 512 at 992 keys, not in two rows of 1,024)."""
  groups: dict[int, list[int]] = {}
  for index, item in enumerate(items):
    reach = window_reach(required_length(item, share_prefix=True))
    groups.setdefault(reach if reach > ONE_LEAF_REACH else 0, []).append(index)
  return [groups[reach] for reach in sorted(groups)]


def steps_by_window(rows: dict[str, np.ndarray], batch: int) -> list[tuple[np.ndarray, int]]:
  """The rows (indices) stepped together at one window, with the longest item among them: rows ordered by the
  window their own longest item needs, widest first, cut into steps of `batch` rows, each step at its widest
  row's window, consecutive steps of one window together. A few long contexts widen their own steps' windows only
  (CMMLU 0-shot: 5 of 144 contexts need 384 keys, 123 no more than 192). Every window of a call's ladder gives an
  item the same bits (packing.neighbour_free_bound), so which step a row lands in changes no result."""
  longest = longest_items(rows["segment_ids"], rows.get("key_shift"))
  reach = np.array([window_reach(int(n)) for n in longest])
  order = np.argsort(-reach, kind="stable")
  runs: list[list[int]] = []
  for start in range(0, len(order), batch):
    step = order[start:start + batch]
    if runs and reach[runs[-1][0]] == reach[step[0]]:
      runs[-1] += step.tolist()
    else:
      runs.append(step.tolist())
  return [(np.asarray(run), int(longest[run].max())) for run in runs]
