r"""Item-local attention on this machine: the query blocks one after another (`looped`, what a CPU runs) against
every block in one batched matmul (what an accelerator runs), same inputs, same process.

  python -m s2sjax.benchmarks.local_attention [--rows=12] [--row_length=1024] [--reaches=128,256,768] \
      [--heads=9] [--kv_heads=3] [--head_dim=64] [--dtype=float32] [--repeats=3] [--output=FILE.json]

The defaults are one SmolLM2-135M layer (9 query heads over 3 kv heads of 64) over 12 rows of 1,024 tokens, as
lm-eval's CMMLU 3-shot lays its contexts (items up to ~630 tokens: 768 keys of reach); `--reaches` are the windows
(keys before each block of 32 queries), the rows holding items of reach + 1 tokens, the widest a window holds.
Printed and written: each side's best wall time of `--repeats` after its compile, their ratio, whether the outputs
are the same bits, and one 2048^2 matmul's GFLOP/s in this process (how fast this machine is today). A benchmark,
not a test.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from s2sjax.benchmarks.machine import cpu_machine, machine_line
from s2sjax.runtime import cli
from s2sjax.model.attention import LOCAL_BLOCK, LocalWindow, local_window_mask, xla

FLAGS = flags.FLAGS


def timed(step, args, repeats: int) -> tuple[np.ndarray, float]:
  """The step's output (from its first, compiling call) and the best wall time of `repeats` calls after it."""
  output = np.asarray(step(*args), np.float32)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(step(*args))
    times.append(time.perf_counter() - start)
  return output, min(times)


def measure(rows: int, length: int, reach: int, heads: int, kv_heads: int, head_dim: int, dtype, repeats: int) -> dict:
  """Both schedules on random q, k, v and rows of items `reach + 1` tokens long (the widest the window holds)."""
  window = LocalWindow(LOCAL_BLOCK, reach)
  q, k, v = (jax.random.normal(key, (rows, length, n, head_dim), dtype)
             for key, n in zip(jax.random.split(jax.random.PRNGKey(0), 3), (heads, kv_heads, kv_heads)))
  segments = jnp.asarray(np.broadcast_to(np.arange(length) // (reach + 1) + 1, (rows, length)), jnp.int32)
  mask = local_window_mask(segments, None, window)
  schedules = {}
  outputs = {}
  for name, looped in (("all_at_once", False), ("looped", True)):
    step = jax.jit(lambda q, k, v, mask, looped=looped: xla.local_attention(q, k, v, mask, window, looped=looped))
    outputs[name], schedules[name] = timed(step, (q, k, v, mask), repeats)
  return dict(rows=rows, length=length, reach=reach, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
              all_at_once_s=schedules["all_at_once"], looped_s=schedules["looped"],
              speedup=schedules["all_at_once"] / schedules["looped"],
              same_bits=bool(np.array_equal(outputs["looped"], outputs["all_at_once"])))


def define_flags() -> None:
  flags.DEFINE_integer("rows", 12, "Rows a step.")
  flags.DEFINE_integer("row_length", 1024, "Tokens a row (a multiple of 32).")
  flags.DEFINE_list("reaches", ["128", "256", "768"], "Keys before each query block (multiples of 32).")
  flags.DEFINE_integer("heads", 9, "Query heads.")
  flags.DEFINE_integer("kv_heads", 3, "Key and value heads.")
  flags.DEFINE_integer("head_dim", 64, "Head width.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "q, k and v's dtype.")
  flags.DEFINE_integer("repeats", 3, "Timed runs a side (the best is kept).")
  flags.DEFINE_string("output", None, "Also write the figures as JSON here.")


def main(argv) -> None:
  del argv
  dtype = jnp.dtype(FLAGS.dtype)
  results = []
  print("| rows x length | reach | all at once ms | looped ms | speed-up | same bits |\n|---|---|---|---|---|---|")
  for reach in map(int, FLAGS.reaches):
    result = measure(FLAGS.rows, FLAGS.row_length, reach, FLAGS.heads, FLAGS.kv_heads, FLAGS.head_dim, dtype,
                     FLAGS.repeats)
    results.append(result)
    print(f"| {result['rows']} x {result['length']} | {reach} | {result['all_at_once_s'] * 1e3:.0f} | "
          f"{result['looped_s'] * 1e3:.0f} | {result['speedup']:.2f}x | {result['same_bits']} |", flush=True)
  machine = cpu_machine(dtype) if jax.default_backend() == "cpu" else {"backend": jax.default_backend()}
  print(machine_line(machine) if "matmul" in machine else machine)
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump({"dtype": FLAGS.dtype, "results": results, "machine": machine}, f, indent=1)


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__, flag_modules=(__name__,))
