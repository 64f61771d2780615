r"""Accelerator benchmark: scoring throughput, achieved FLOP/s and MFU of Qwen2.5-shaped models (random weights).

  python -m s2sjax.bench --mode=accelerator [--sizes=qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b] [--row_length=2048] \
      [--attention=xla,dot_product,flash] [--dtype=bfloat16] [--rows=8] [--peak_tflops=989]

Rows are full of benchmark-like items (speech-like prefixes, four options, shared prefixes) so the step does the
real work: decoder over every row token, the head at the scored positions. MFU = the model's FLOPs (weights and
attention, the head at scored tokens) / (devices x peak). Peak bf16 TFLOP/s is looked up from the device kind
(TPU v4/v5e/v5p/v6e, H100, H200) unless given.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax import plan, sharding
from s2sjax.model.decoder import init_params
from s2sjax.packing import RowShape, pack
from s2sjax.scoring import Scorer

PEAK_TFLOPS = {"v4": 275, "v5 lite": 197, "v5e": 197, "v5p": 459, "v6": 918, "h100": 989, "h200": 989}


def peak_tflops(device_kind: str) -> float | None:
  kind = device_kind.lower()
  return next((v for k, v in PEAK_TFLOPS.items() if k in kind), None)


def step_flops(config, rows: dict[str, np.ndarray], length: int) -> float:
  """Model FLOPs of one pass over `rows`: every laid token through the layers (attention over the row), and the
  head at the scored tokens."""
  # model FLOPs count the causal half of the attention (MFU convention), not the masked keys the step computes
  return plan.forward_flops(config, int((rows["segment_ids"] > 0).sum()), length / 2,
                            int((rows["target_slot"] >= 0).sum()))


def measure(size: str, length: int, rows_per_step: int, attention: str, dtype, repeats: int = 3,
            peak: float | None = None) -> dict:
  from s2sjax.bench import make_items

  config = plan.MODELS[size] if size in plan.MODELS else _tiny()
  params = init_params(config, jax.random.PRNGKey(0), param_dtype=dtype)
  share = attention != "flash"
  items = make_items("speech", 200, config.vocab_size)
  rows, report = pack(items, RowShape.for_length(length), share_prefix=share)
  rows = {k: v[:rows_per_step] for k, v in rows.items()}
  scorer = Scorer(config, RowShape.for_length(length), mesh=sharding.make_mesh("data:-1"), batch_size=rows_per_step,
                  dtype=dtype, attention=attention)
  scorer.score(params, rows, progress=False)  # compile
  start = time.time()
  for _ in range(repeats):
    scorer.score(params, rows, progress=False)
  seconds = (time.time() - start) / repeats
  flops = step_flops(config, rows, length)
  devices = jax.device_count()
  peak = peak or peak_tflops(jax.devices()[0].device_kind)
  return {
    "size": size, "attention": attention, "dtype": str(jnp.dtype(dtype)), "row_length": length, "rows": rows_per_step,
    "tokens_per_s": float((rows["segment_ids"] > 0).sum() / seconds), "tflops_per_s": flops / seconds / 1e12,
    "mfu": flops / seconds / (devices * peak * 1e12) if peak else None, "packing": report.efficiency,
    "device": f"{jax.devices()[0].device_kind} x{devices}",
  }


def _tiny():
  import dataclasses

  return dataclasses.replace(plan.MODELS["qwen2.5-0.5b"], hidden_size=128, intermediate_size=256, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=32, rotary_dim=32, vocab_size=4096)


def format_rows(results: list[dict]) -> str:
  lines = ["| model | attention | dtype | L | rows | tokens/s | TFLOP/s | MFU | device |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (no peak known)"
    lines.append(f"| {r['size']} | {r['attention']} | {r['dtype']} | {r['row_length']} | {r['rows']} | "
                 f"{r['tokens_per_s']:,.0f} | {r['tflops_per_s']:.2f} | {mfu} | {r['device']} |")
  return "\n".join(lines)
