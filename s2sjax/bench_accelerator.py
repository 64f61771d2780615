r"""Accelerator benchmark: scoring throughput, achieved FLOP/s and MFU of Qwen2.5-shaped models (random weights).

  python -m s2sjax.bench --mode=accelerator [--sizes=qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b] [--row_length=2048] \
      [--attention=xla,dot_product,flash] [--dtype=bfloat16] [--rows=8] [--mesh=data:-1] [--peak_tflops=989] \
      [--compile_only] [--output=FILE.json]

Rows are full of benchmark-like items (speech-like prefixes, four options, shared prefixes unless the kernel is
flash) so the step does the real work: decoder over every row token, the head at the scored positions. MFU = the
model's FLOPs (weights and attention, the head at scored tokens) / (devices x peak). Peak bf16 TFLOP/s is looked up
from the device kind (TPU v4/v5e/v5p/v6e, H100, H200) unless given.

Each configuration prints its line as soon as it is done (and `--output` is rewritten), so a long run shows
progress, and one that runs out of memory or fails is reported as such (with the error's first line) while the
others still run. `flash` is measured on TPU only: elsewhere it runs in Pallas interpret mode, which checks numbers,
not speed. `--compile_only` compiles each
configuration for abstract weights and prints XLA's memory analysis per device instead: what fits, before any
accelerator time is spent. Run it on the target: XLA:CPU computes bf16 matmuls in fp32 and keeps fp32 copies of
the weights, so a CPU compile of a bf16 model overstates its memory (7B, 8 rows: 52 GiB on CPU; the planner
says 26).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax import plan, sharding
from s2sjax.model import layers
from s2sjax.model.decoder import init_params
from s2sjax.packing import RowShape, pack
from s2sjax.scoring import Scorer

PEAK_TFLOPS = {"v4": 275, "v5 lite": 197, "v5e": 197, "v5p": 459, "v6": 918, "h100": 989, "h200": 989}

# The published shapes, plus a tiny one for tests.
SIZES = {
  **plan.MODELS,
  "tiny": dataclasses.replace(plan.MODELS["qwen2.5-0.5b"], hidden_size=128, intermediate_size=256, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=32, rotary_dim=32, vocab_size=4096),
}

COLUMNS = ("model", "attention", "dtype", "L", "rows", "tokens/s", "TFLOP/s", "MFU", "device")


def model_config(size: str):
  if size not in SIZES:
    raise ValueError(f"unknown model size {size!r}; known: {sorted(SIZES)}")
  return SIZES[size]


def peak_tflops(device_kind: str) -> float | None:
  kind = device_kind.lower()
  return next((v for k, v in PEAK_TFLOPS.items() if k in kind), None)


def step_flops(config, rows: dict[str, np.ndarray], length: int) -> float:
  """Model FLOPs of one pass over `rows`: every laid token through the layers (attention over the row), and the
  head at the scored tokens."""
  # model FLOPs count the causal half of the attention (MFU convention), not the masked keys the step computes
  return plan.forward_flops(config, int((rows["segment_ids"] > 0).sum()), length / 2,
                            int((rows["target_slot"] >= 0).sum()))


def benchmark_rows(config, length: int, count: int, share_prefix: bool) -> dict[str, np.ndarray]:
  """`count` full packed rows of speech-like items (about 200 prefix tokens, four options of 5-15)."""
  from s2sjax.bench import make_items

  # a row of 2048 holds about 2 such items unshared, 8 shared: 10 per row always leaves rows to spare
  rows, _ = pack(make_items("speech", 10 * count * max(1, length // 2048), config.vocab_size),
                 RowShape.for_length(length), share_prefix=share_prefix)
  if len(rows["tokens"]) < count:
    raise ValueError(f"the benchmark items packed into {len(rows['tokens'])} rows of {length}, {count} needed")
  return {k: v[:count] for k, v in rows.items()}


def measure(size: str, length: int, rows_per_step: int, attention: str, dtype, mesh_spec: str = "data:-1",
            repeats: int = 3, peak: float | None = None, compile_only: bool = False) -> dict:
  """One configuration's figures; a configuration that cannot run here says why under "skipped"."""
  config = model_config(size)
  devices = jax.device_count()
  result = {"size": size, "attention": attention, "dtype": str(jnp.dtype(dtype)), "row_length": length,
            "mesh": mesh_spec, "device": f"{jax.devices()[0].device_kind} x{devices}"}
  if attention in layers.FLASH_IMPLEMENTATIONS and jax.default_backend() != "tpu":
    return {**result, "skipped": "flash is a TPU kernel (interpreted elsewhere: a numbers check, not a speed)"}
  scorer = Scorer(config, RowShape.for_length(length), mesh=sharding.make_mesh(mesh_spec), batch_size=rows_per_step,
                  dtype=dtype, attention=attention)
  result["rows"] = scorer.batch_size  # rounded up to the data-parallel devices: every row is real work
  try:
    if compile_only:
      analysis = scorer.lower_abstract(dtype).compile().memory_analysis()
      return {**result, "compiled_gib": (analysis.argument_size_in_bytes + analysis.temp_size_in_bytes) / 2**30}
    rows = benchmark_rows(config, length, scorer.batch_size, share_prefix=attention != "flash")  # flash_shared: shared
    # initialised straight into their shardings: a 7B model need not fit one device first
    params = jax.jit(functools.partial(init_params, config, param_dtype=dtype),
                     out_shardings=scorer.param_shardings)(jax.random.PRNGKey(0))
    scorer.score(params, rows, progress=False)  # compile
    start = time.time()
    for _ in range(repeats):
      scorer.score(params, rows, progress=False)
    seconds = (time.time() - start) / repeats
  except Exception as e:  # noqa: BLE001 - reported in the table and the JSON; the other configurations still run
    why = "out of memory" if "RESOURCE_EXHAUSTED" in str(e) else f"failed ({type(e).__name__})"
    return {**result, "skipped": f"{why}: " + (str(e).splitlines() or [""])[0][:200]}
  flops = step_flops(config, rows, length)
  peak = peak or peak_tflops(jax.devices()[0].device_kind)
  return {
    **result, "tokens_per_s": float((rows["segment_ids"] > 0).sum() / seconds), "tflops_per_s": flops / seconds / 1e12,
    "mfu": flops / seconds / (devices * peak * 1e12) if peak else None,
    "fill": float((rows["segment_ids"] > 0).mean()),
  }


def format_row(r: dict) -> str:
  """One markdown table line (the header is `format_header()`)."""
  head = f"| {r['size']} | {r['attention']} | {r['dtype']} | {r['row_length']} | {r.get('rows', '-')} |"
  if "skipped" in r:
    return f"{head} {r['skipped']} | | | {r['device']} |"
  if "compiled_gib" in r:
    return f"{head} compiled: {r['compiled_gib']:.2f} GiB per device (XLA memory analysis) | | | {r['device']} |"
  mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (no peak known)"
  return f"{head} {r['tokens_per_s']:,.0f} | {r['tflops_per_s']:.2f} | {mfu} | {r['device']} |"


def format_header() -> str:
  return "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def run(sizes: list[str], attentions: list[str], length: int, rows_per_step: int, dtype, mesh_spec: str,
        peak: float | None, compile_only: bool, output: str | None) -> list[dict]:
  """Measures every size x attention, printing each line when it is done."""
  for size in sizes:  # a typo should fail now, not after an hour of measurements
    model_config(size)
  print(format_header(), flush=True)
  results = []
  for size in sizes:
    for attention in attentions:
      results.append(measure(size, length, rows_per_step, attention, dtype, mesh_spec, peak=peak,
                             compile_only=compile_only))
      print(format_row(results[-1]), flush=True)
      if output:
        with open(output, "w") as f:
          json.dump(results, f, indent=2)
  return results
