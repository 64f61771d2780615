r"""The plan of an evaluation before it runs: memory per chip, a mesh that fits, and the time for the whole
S2SBench (`plan`); how each figure is reached, and what `s2sjax.eval` asks of it, is the command's docstring
(`python -m s2sjax.plan`, s2sjax/commands/plan.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING


from s2sjax.scoring import architectures
from s2sjax.model import families
from s2sjax.data import task_registry
from s2sjax.runtime.errors import UserError
from s2sjax.model.config import ModelConfig
from s2sjax.scoring.scorer import TARGET_CHUNK  # the accelerators' head chunk, the slices planned here

if TYPE_CHECKING:
  from s2sjax.data.packing import RowShape


@dataclasses.dataclass(frozen=True)
class Chip:
  count: int
  hbm_gib: float
  peak_tflops_bf16: float


# Public per-chip figures (HBM, dense bf16 peak).
TOPOLOGIES = {
  "v4-8": Chip(4, 32, 275), "v4-32": Chip(16, 32, 275), "v4-128": Chip(64, 32, 275),
  "v5e-1": Chip(1, 16, 197), "v5e-4": Chip(4, 16, 197), "v5e-8": Chip(8, 16, 197), "v5e-16": Chip(16, 16, 197),
  "v5e-256": Chip(256, 16, 197), "v5p-8": Chip(4, 95, 459), "v5p-32": Chip(16, 95, 459),
  "v6e-1": Chip(1, 32, 918), "v6e-8": Chip(8, 32, 918), "v6e-256": Chip(256, 32, 918),
  "h100-8": Chip(8, 80, 989), "h200-1": Chip(1, 141, 989), "h200-8": Chip(8, 141, 989),
}


def named_models() -> dict:
  """Architectures of the published checkpoints, for planning without the weights: every family's and every planned
  architecture's (a plugin's too, so read when asked, not at import)."""
  return {**families.planner_shapes(), **architectures.planner_shapes()}

# Tokens of S2SBench's spoken-prefix instruction; the tasks' own sizes are their records in s2sjax.data.task_registry.
INSTRUCTION_TOKENS = 14


def bytes_of(dtype: str) -> int:
  return 2 if dtype == "bfloat16" else 4


def param_bytes(config, dtype: str) -> int:
  """Every parameter a checkpoint of any planned architecture holds."""
  return config.num_params() * bytes_of(dtype)


def planned_decoder(config) -> ModelConfig | None:
  """The shared-decoder shape whose FLOPs and activations the config's scoring step costs; None: its architecture
  is not planned (Moshi's)."""
  planned = architectures.for_config(config).planned
  return planned(config) if planned else None


def activation_bytes(config: ModelConfig, rows: int, length: int, dtype: str, model_parallel: int = 1,
                     keys: int | None = None, queries: int | None = None) -> int:
  """Peak live activations of the scoring step for `rows` rows on one chip (heads, mlp and vocab split
  `model_parallel` ways): the larger of the layer phase (fp32 attention scores, their masked copy and the
  probabilities, about three [rows, heads, L, keys] buffers, plus MLP and residual activations and the mask) and
  the head phase (one chunk of fp32 logits plus the gathered hidden states). `keys`: what each query's scores
  span (`attention_keys`); the whole row by default. `queries`: how many of a row's queries hold their scores at
  once (`attention_queries`); the whole row by default."""
  b = bytes_of(dtype)
  keys = length if keys is None else keys
  heads = math.ceil(config.num_heads / model_parallel)
  scores = rows * heads * (length if queries is None else queries) * keys * 4
  mlp = rows * length * math.ceil(config.intermediate_size / model_parallel) * b
  residual = rows * length * config.hidden_size * b
  layer_phase = 3 * scores + 2 * mlp + 2 * residual + rows * length * keys
  if queries is not None and queries < length:  # blocks looped: keys and values padded, queries and outputs by block
    kv_heads = math.ceil(config.num_kv_heads / model_parallel)
    by_block = 2 * rows * (length + keys) * kv_heads + 2 * rows * length * heads
    layer_phase += by_block * config.head_dim * b
  head_phase = rows * TARGET_CHUNK * math.ceil(config.vocab_size / model_parallel) * 4 + 2 * residual
  return max(layer_phase, head_phase)


def attention_keys(shape: RowShape, attention: str) -> int:
  """Keys per query whose scores the step holds in memory: none for the fused kernels (flash, cudnn: scores live
  in on-chip blocks), the item-local window where the shape records its longest item, else the whole row."""
  from s2sjax.model.attention import FLASH_IMPLEMENTATIONS, FUSED_IMPLEMENTATIONS, LOCAL_BLOCK, local_window

  if attention in FLASH_IMPLEMENTATIONS or FUSED_IMPLEMENTATIONS.get(attention):
    return 0
  window = local_window(shape.max_item, shape.length)
  return window.span if window else shape.length


def attention_queries(shape: RowShape, attention: str, platform: str) -> int:
  """Queries of a row whose scores the step holds at once on `platform`: one block where our item-local einsums
  compute the blocks one after another (`xla.loops_over_blocks`: a CPU), else the whole row."""
  from s2sjax.model.attention import LOCAL_BLOCK, local_window, xla

  windowed = local_window(shape.max_item, shape.length) is not None
  return LOCAL_BLOCK if attention == "xla" and windowed and xla.loops_over_blocks(platform) else shape.length


def device_memory(device) -> int:
  """Bytes one device may use: what it reports (accelerators), else the host's memory shared by its devices."""
  import jax

  stats = device.memory_stats() or {}
  if "bytes_limit" in stats:
    return int(stats["bytes_limit"])
  host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return host // max(len(jax.local_devices(backend=device.platform)), 1)


class MemoryPlanError(UserError, ValueError):
  """A scoring step the planner can tell will not fit a device's memory."""


# `activation_bytes` against XLA's analysis of the compiled step: within 20% over whole rows, up to 2x over with
# item-local windows (XLA fuses some of the three score buffers there), never under by more than 10%. So a step
# estimated at more than twice a device's memory cannot fit, and one below may.
ESTIMATE_OVER = 2.0


def check_step_memory(config, shapes: list[RowShape], batch_size: int, dtype: str, attention: str, mesh) -> None:
  """Refuses, before anything is compiled, a scoring step whose parameters and activations (`activation_bytes`)
  would need more than ESTIMATE_OVER x a device's memory, naming the figures and what to lower. Architectures that
  do not say what their step costs (Moshi's) are not planned here."""
  import jax

  decoder = planned_decoder(config)
  if decoder is None:
    return
  data_parallel, model_parallel = mesh.shape["data"] * mesh.shape["fsdp"], mesh.shape["model"]
  rows = math.ceil(batch_size / data_parallel)
  params = param_bytes(config, dtype) / (model_parallel * mesh.shape["fsdp"])
  # this process's own devices: another process's cannot report their memory (every device of a mesh is alike)
  device = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
  memory = device_memory(device)
  gib = lambda n: f"{n / 2**30:,.1f} GiB"
  for shape in shapes:
    keys, queries = attention_keys(shape, attention), attention_queries(shape, attention, device.platform)
    per_row = activation_bytes(decoder, 1, shape.length, dtype, model_parallel, keys, queries)  # grows with rows
    if params + rows * per_row <= ESTIMATE_OVER * memory:
      continue
    activations = rows * per_row
    most = max(int((ESTIMATE_OVER * memory - params) // per_row), 0)  # rows per device that may fit
    remedy = (f"--batch_size={most * data_parallel} or less may fit" if most else
              f"not even one row fits: rebuild with a shorter --row_length (its rows hold the longest item, "
              f"{shape.max_item:,} tokens; --overlong=truncate_prefix cuts long prefixes) or split the model over "
              "more devices (--mesh=...,model:N)")
    raise MemoryPlanError(
      f"the scoring step would need about {gib(params + activations)} per device ({gib(params)} of parameters + "
      f"{gib(activations)} of activations: {rows} row(s) of {shape.length:,} tokens, attention over {keys:,} keys "
      f"each with --attention={attention}), more than twice a device's {gib(memory)}: {remedy}")


def forward_flops(config: ModelConfig, tokens: float, context: float, scored: float) -> float:
  """The one FLOP count used by the planner and both benchmarks: `tokens` through the layers (2 x the layer
  weights, plus attention scores and values over `context` keys each) and the head at `scored` positions. The
  embedding lookup is no matmul, so its table counts only where it is the (tied) head."""
  c = config
  layer_weights = c.num_params() - c.vocab_size * c.hidden_size * (1 if c.tie_embeddings else 2)
  per_token = 2 * layer_weights + 4 * c.num_layers * c.num_heads * c.head_dim * context
  return tokens * per_token + scored * 2 * c.hidden_size * c.vocab_size


def benchmark_flops(config: ModelConfig, frame_rate: float, row_length: int, packing: float = 0.95) -> dict[str, float]:
  """FLOPs of every task x modality: tokens computed (shared prefixes and candidates as laid, without their last
  token; packed at `packing`, each attending over the whole row: an upper bound where attention is item-local) and
  the head at every candidate token."""
  out = {}
  for task in task_registry.names():
    record = task_registry.get(task)
    # S2SBench's layouts, T->T and S->T: a release without text is asked S->S only (the utterance protocol), and a
    # folder of recordings (SpokenStoryCloze's, SlamKit's cross-modal stories) is no part of the benchmark planned
    if not record.has_text or record.release.index == "folder":
      continue
    sizes = record.sizes
    scored = record.candidates * sizes.candidate_tokens
    laid = record.candidates * (sizes.candidate_tokens - 1)
    text = sizes.prefix_tokens + laid
    speech = INSTRUCTION_TOKENS + 2 + sizes.seconds * frame_rate + laid
    for modality, tokens in (("t2t", text), ("s2t", speech)):
      out[f"{task}/{modality}"] = forward_flops(config, sizes.questions * tokens / packing, row_length,
                                                sizes.questions * scored)
  return out


def plan(config, topology: str, row_length: int, batch: int, dtype: str, frame_rate: float, mfu: float) -> dict:
  """`config`: any planned architecture's (`planned_decoder`)."""
  if topology not in TOPOLOGIES:
    raise ValueError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
  decoder = planned_decoder(config)
  if decoder is None:
    raise MemoryPlanError(f"the {architectures.for_config(config).name} architecture does not say what its scoring "
                          "step costs: it cannot be planned")
  chip = TOPOLOGIES[topology]
  budget = 0.9 * chip.hbm_gib * (1 << 30)
  choice = None
  for model_parallel in (m for m in (1, 2, 4, 8, 16) if m <= chip.count and chip.count % m == 0):
    data = chip.count // model_parallel
    rows = max(1, math.ceil(batch / data))
    params = param_bytes(config, dtype) / model_parallel
    activations = activation_bytes(decoder, rows, row_length, dtype, model_parallel)
    choice = dict(mesh=f"data:{data},model:{model_parallel}", rows_per_chip=rows, params_gib=params / (1 << 30),
                  activations_gib=activations / (1 << 30), total_gib=(params + activations) / (1 << 30),
                  fits=params + activations <= budget)
    if choice["fits"]:
      break
  flops = benchmark_flops(decoder, frame_rate, row_length)
  seconds = {k: v / (chip.count * chip.peak_tflops_bf16 * 1e12 * mfu) for k, v in flops.items()}
  return dict(topology=topology, chips=chip.count, hbm_gib=chip.hbm_gib, **choice,
              benchmark_tflops=sum(flops.values()) / 1e12, seconds=seconds, total_seconds=sum(seconds.values()),
              mfu=mfu)
