r"""Accelerator benchmark: scoring throughput, achieved FLOP/s and MFU of Qwen2.5-shaped models (random weights).

  python -m s2sjax.bench --mode=accelerator [--sizes=qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b] [--row_length=2048] \
      [--attention=auto,xla,dot_product,cudnn,flash,flash_shared] [--protocols=noshare,shared,local] \
      [--dtype=bfloat16] [--rows=8] [--mesh=data:-1] [--peak_tflops=989] [--compile_only] [--output=FILE.json]

Rows are full of benchmark-like items (speech-like prefixes, four options) laid as `PROTOCOLS` lays them:
`noshare` (every prefix + candidate its own segment), `shared` (each prefix once, candidates branching from it,
dense attention) or `local` (the shared rows, each query block attending over its item's keys only). The step does
the real work: decoder over every row token, the head at the scored positions. MFU = useful model FLOPs (the
weights, attention over the keys each token may see, the head at scored tokens) / (devices x peak), so a layout
that computes masked keys pays for them in MFU. Peak bf16 TFLOP/s is looked up from the device kind (TPU
v4/v5e/v5p/v6e, H100, H200) unless given. The last column is the largest difference in a candidate's mean NLL from
the size's first configuration: every layout and kernel scores the same items with the same weights.
`--attention=auto` measures what `s2sjax.eval --attention=auto` runs on each layout (`auto_implementation`).

Each configuration prints its line as soon as it is done (and `--output` is rewritten), so a long run shows
progress, and one that runs out of memory or fails is reported as such (with the error's first line) while the
others still run. `flash` and `flash_shared` are measured on TPU only: elsewhere they run in Pallas interpret
mode, which checks numbers, not speed; `cudnn` needs a GPU. A kernel and a layout that do not go together (flash
reads no branch ids; the flash kernels have no item-local path) are left out. `--compile_only` compiles each
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

from s2sjax.scoring import planner
from s2sjax.runtime import sharding
from s2sjax.benchmarks.workloads import PROTOCOLS, BenchError, make_items
from s2sjax.model.attention import (ATTENTION_IMPLEMENTATIONS, FLASH_IMPLEMENTATIONS, auto_implementation,
  packed_attention_mask)
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import init_params
from s2sjax.data.packing import RowShape, fit, longest_item, pack
from s2sjax.scoring.scorer import Scorer


PEAK_TFLOPS = {"v4": 275, "v5 lite": 197, "v5e": 197, "v5p": 459, "v6": 918, "h100": 989, "h200": 989}

def sizes() -> dict:
  """The published shapes of the shared decoder (the step this benchmark times), plus a tiny one for tests."""
  published = {name: config for name, config in planner.named_models().items() if isinstance(config, ModelConfig)}
  return {**published, "tiny": dataclasses.replace(published["qwen2.5-0.5b"], hidden_size=128, intermediate_size=256,
                                                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                                                   rotary_dim=32, vocab_size=4096)}


COLUMNS = ("model", "attention", "rows laid", "dtype", "L", "rows", "tokens/s", "TFLOP/s", "MFU", "compile s",
           "max |Δ NLL| vs first", "device")


def model_config(size: str):
  known = sizes()
  if size not in known:
    raise BenchError(f"unknown model size {size!r}; known: {sorted(known)}")
  return known[size]


def peak_tflops(device_kind: str) -> float | None:
  kind = device_kind.lower()
  return next((v for k, v in PEAK_TFLOPS.items() if k in kind), None)


def attended_keys(rows: dict[str, np.ndarray]) -> int:
  """Query-key pairs the packed rows need: each token over the earlier tokens of its item it may see (its prefix
  and its own branch), as the dense step's mask allows them."""
  return sum(int(packed_attention_mask(rows["segment_ids"][r : r + 1], rows["branch_ids"][r : r + 1]).sum())
             for r in range(len(rows["segment_ids"])))  # a row at a time: an [R, L, L] mask need not fit at once


def step_flops(config, rows: dict[str, np.ndarray]) -> float:
  """Useful model FLOPs of one pass over `rows`: every laid token through the layers, attending over the keys of
  its item it may see (not the masked keys a dense step computes), and the head at the scored tokens."""
  tokens = int((rows["segment_ids"] > 0).sum())
  return planner.forward_flops(config, tokens, attended_keys(rows) / max(tokens, 1), int((rows["target_slot"] >= 0).sum()))


def benchmark_rows(config, length: int, count: int, share_prefix: bool) -> dict[str, np.ndarray]:
  """`count` full packed rows of speech-like items (about 200 prefix tokens, four options of 5-15)."""
  # a row of 2048 holds about 2 such items unshared, 8 shared: 10 per row always leaves rows to spare
  rows, _ = pack(make_items("speech", 10 * count * max(1, length // 2048), config.vocab_size),
                 RowShape.for_length(length), share_prefix=share_prefix)
  if len(rows["tokens"]) < count:
    raise ValueError(f"the benchmark items packed into {len(rows['tokens'])} rows of {length}, {count} needed")
  return {k: v[:count] for k, v in rows.items()}


def unpaired(attention: str, protocol: str) -> str | None:
  """Why a kernel cannot read rows laid this way anywhere (None: it can)."""
  if attention == "flash" and protocol != "noshare":
    return "flash reads no branch ids: rows without sharing only"
  if attention in FLASH_IMPLEMENTATIONS and protocol == "local":
    return "the flash kernels have no item-local path"
  return None


def not_measured_here(attention: str) -> str | None:
  """Why a kernel is not timed on this backend (None: it is)."""
  if attention in FLASH_IMPLEMENTATIONS and jax.default_backend() != "tpu":
    return "flash is a TPU kernel (interpreted elsewhere: a numbers check, not a speed)"
  if attention == "cudnn" and jax.default_backend() != "gpu":
    return "cudnn is a GPU kernel"
  return None


def candidate_mean_nll(rows: dict[str, np.ndarray], nll_sum: np.ndarray, n_tokens: np.ndarray) -> dict[tuple, float]:
  """(item, candidate) -> mean NLL of every candidate the rows hold."""
  used = rows["slot_item"] >= 0
  return {(int(i), int(c)): float(s / n) for i, c, s, n in
          zip(rows["slot_item"][used], rows["slot_candidate"][used], nll_sum[used], n_tokens[used])}


def measure(size: str, length: int, rows_per_step: int, attention: str, dtype, mesh_spec: str = "data:-1",
            repeats: int = 3, peak: float | None = None, compile_only: bool = False,
            protocol: str = "shared") -> dict:
  """One configuration's figures; a configuration that cannot run here says why under "skipped". The candidates'
  mean NLLs ride along under "candidate_nll" (not written to JSON)."""
  config = model_config(size)
  devices = jax.device_count()
  _, share, local = PROTOCOLS[protocol]
  result = {"size": size, "attention": attention, "protocol": protocol, "dtype": str(jnp.dtype(dtype)),
            "row_length": length, "mesh": mesh_spec, "device": f"{jax.devices()[0].device_kind} x{devices}"}
  why_not = unpaired(attention, protocol) or not_measured_here(attention)
  if why_not:
    return {**result, "skipped": why_not}
  try:
    # enough rows for any rounding of rows_per_step to the data-parallel devices (the Scorer's batch size)
    rows = benchmark_rows(config, length, rows_per_step * devices, share_prefix=share)
    rows, shape = fit(rows, RowShape.for_length(length), longest_item(rows["segment_ids"]))  # as a build lays them
    scorer = Scorer(config, shape, mesh=sharding.make_mesh(mesh_spec), batch_size=rows_per_step, dtype=dtype,
                    attention=attention, local_attention=local)
    result["rows"] = scorer.batch_size  # rounded up to the data-parallel devices: every row is real work
    rows = {k: v[: scorer.batch_size] for k, v in rows.items()}
    if compile_only:
      analysis = scorer.lower_abstract(dtype).compile().memory_analysis()
      return {**result, "compiled_gib": (analysis.argument_size_in_bytes + analysis.temp_size_in_bytes) / 2**30}
    # initialised straight into their shardings: a 7B model need not fit one device first
    params = jax.jit(functools.partial(init_params, config, param_dtype=dtype),
                     out_shardings=scorer.param_shardings)(jax.random.PRNGKey(0))
    start = time.time()
    scorer.score(params, rows, progress=False)  # compile
    compile_s = time.time() - start
    start = time.time()
    for _ in range(repeats):
      nll_sum, n_tokens = scorer.score(params, rows, progress=False)
    seconds = (time.time() - start) / repeats
  except Exception as e:  # noqa: BLE001 - reported in the table and the JSON; the other configurations still run
    why = "out of memory" if "RESOURCE_EXHAUSTED" in str(e) else f"failed ({type(e).__name__})"
    return {**result, "skipped": f"{why}: " + (str(e).splitlines() or [""])[0][:200]}
  flops = step_flops(config, rows)
  peak = peak or peak_tflops(jax.devices()[0].device_kind)
  return {
    **result, "tokens_per_s": float((rows["segment_ids"] > 0).sum() / seconds), "tflops_per_s": flops / seconds / 1e12,
    "mfu": flops / seconds / (devices * peak * 1e12) if peak else None, "compile_s": compile_s,
    "fill": float((rows["segment_ids"] > 0).mean()), "candidate_nll": candidate_mean_nll(rows, nll_sum, n_tokens),
  }


def nll_difference(result: dict, first: dict) -> float | None:
  """Largest |Δ mean NLL| over the candidates both configurations scored."""
  common = result.get("candidate_nll", {}).keys() & first.get("candidate_nll", {}).keys()
  return max((abs(result["candidate_nll"][k] - first["candidate_nll"][k]) for k in common), default=None)


def format_row(r: dict) -> str:
  """One markdown table line (the header is `format_header()`)."""
  head = (f"| {r['size']} | {r['attention']} | {r['protocol']} | {r['dtype']} | {r['row_length']} | "
          f"{r.get('rows', '-')} |")
  if "skipped" in r:
    return f"{head} {r['skipped']} | | | | | {r['device']} |"
  if "compiled_gib" in r:
    return f"{head} compiled: {r['compiled_gib']:.2f} GiB per device (XLA memory analysis) | | | | | {r['device']} |"
  mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (no peak known)"
  difference = r.get("max_nll_difference")
  difference = "-" if difference is None else f"{difference:.1e}"
  return (f"{head} {r['tokens_per_s']:,.0f} | {r['tflops_per_s']:.2f} | {mfu} | {r['compile_s']:.0f} | {difference} "
          f"| {r['device']} |")


def format_header() -> str:
  return "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def run(sizes: list[str], attentions: list[str], length: int, rows_per_step: int, dtype, mesh_spec: str,
        peak: float | None, compile_only: bool, output: str | None,
        protocols: list[str] = ("shared",)) -> list[dict]:
  """Measures every size x attention x protocol that goes together, printing each line when it is done."""
  for size in sizes:  # a typo should fail now, not after an hour of measurements
    model_config(size)
  choices = {"protocol": (protocols, PROTOCOLS), "attention": (attentions, ("auto", *ATTENTION_IMPLEMENTATIONS))}
  for what, (given, known) in choices.items():
    unknown = sorted(set(given) - set(known))
    if unknown:
      raise BenchError(f"unknown {what}(s) {unknown}; known: {list(known)}")
  print(format_header(), flush=True)
  results = []
  for size in sizes:
    first = None
    for choice in attentions:
      for protocol in protocols:
        _, share, local = PROTOCOLS[protocol]
        attention = auto_implementation(share, local, dtype) if choice == "auto" else choice
        if unpaired(attention, protocol):  # a pairing that cannot exist anywhere: not a line of the table
          continue
        result = measure(size, length, rows_per_step, attention, dtype, mesh_spec, peak=peak,
                         compile_only=compile_only, protocol=protocol)
        first = first or (result if "candidate_nll" in result else None)
        if first is not None and "candidate_nll" in result:
          result["max_nll_difference"] = nll_difference(result, first)
        print(format_row(result), flush=True)
        results.append({k: v for k, v in result.items() if k != "candidate_nll"})
        if output:
          with open(output, "w") as f:
            json.dump(results, f, indent=2)
  return results
