r"""The step's head on this machine: each target's fp32 logsumexp, its logit and whether it is the argmax, with the
argmax test the step makes (`scorer.nll_and_missed`'s `not_greedy`) against `jnp.argmax(logits) != id`, same
inputs, same process.

  python -m s2sjax.benchmarks.head [--shapes=576x49152,896x151936,32x151680] [--targets=128] \
      [--repeats=5] [--output=FILE.json]

A shape is hidden x vocabulary: SmolLM2-135M's, Qwen2.5-0.5B's, and the tests' tiny Qwen2.5-vocabulary model's.
`--targets` is how many targets one chunk of the head holds (`scorer.CPU_HEAD_ROWS` on a CPU). Printed and written:
each side's best wall time a target of `--repeats` after its compile, their ratio, whether both give the same NLL
bits and the same answers (a few targets are made their row's argmax, so both answers occur), and one 2048^2
matmul's GFLOP/s in this process. A benchmark, not a test.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from s2sjax.benchmarks.machine import cpu_machine, machine_line
from s2sjax.benchmarks.local_attention import timed
from s2sjax.runtime import cli
from s2sjax.scoring.scorer import CPU_HEAD_ROWS, nll_and_missed

FLAGS = flags.FLAGS


def head(table, hidden, ids, argmax_test: bool):
  """[T] NLL and [T] missed for hidden states [T, D] over a head table [V, D]: the step's (`nll_and_missed`), or
  the same with `argmax != id` as the greedy test."""
  logits = jnp.einsum("td,vd->tv", hidden, table)
  if not argmax_test:
    return nll_and_missed(logits, ids)
  picked = jnp.take_along_axis(logits, ids[:, None], axis=-1)[:, 0]
  return jax.nn.logsumexp(logits, axis=-1) - picked, jnp.argmax(logits, axis=-1) != ids


def measure(hidden_size: int, vocab: int, targets: int, repeats: int) -> dict:
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  table = jax.random.normal(keys[0], (vocab, hidden_size)) / np.sqrt(hidden_size)
  hidden = jax.random.normal(keys[1], (targets, hidden_size))
  ids = jax.random.randint(keys[2], (targets,), 0, vocab)
  ids = ids.at[: targets // 4].set(jnp.argmax(hidden[: targets // 4] @ table.T, axis=-1))
  outputs, seconds = {}, {}
  for name, argmax_test in (("argmax", True), ("step", False)):
    step = jax.jit(lambda t, h, i, argmax_test=argmax_test: jnp.stack(
      [x.astype(jnp.float32) for x in head(t, h, i, argmax_test)]))
    outputs[name], seconds[name] = timed(step, (table, hidden, ids), repeats)
  return dict(hidden=hidden_size, vocab=vocab, targets=targets,
              argmax_us_per_target=seconds["argmax"] / targets * 1e6,
              step_us_per_target=seconds["step"] / targets * 1e6,
              speedup=seconds["argmax"] / seconds["step"], same_bits=bool(np.array_equal(*outputs.values())),
              greedy_targets=int(targets - outputs["step"][1].sum()))


def define_flags() -> None:
  flags.DEFINE_list("shapes", ["576x49152", "896x151936", "32x151680"], "hidden x vocabulary sizes.")
  flags.DEFINE_integer("targets", CPU_HEAD_ROWS, "Targets in one chunk of the head.")
  flags.DEFINE_integer("repeats", 5, "Timed runs a side (the best is kept).")
  flags.DEFINE_string("output", None, "Also write the figures as JSON here.")


def main(argv) -> None:
  del argv
  results = []
  print("| hidden x vocabulary | targets | argmax us/target | step us/target | speed-up | same bits | greedy |\n"
        "|---|---|---|---|---|---|---|")
  for shape in FLAGS.shapes:
    hidden_size, vocab = map(int, shape.lower().split("x"))
    result = measure(hidden_size, vocab, FLAGS.targets, FLAGS.repeats)
    results.append(result)
    print(f"| {hidden_size} x {vocab:,} | {result['targets']} | {result['argmax_us_per_target']:.0f} | "
          f"{result['step_us_per_target']:.0f} | {result['speedup']:.2f}x | {result['same_bits']} | "
          f"{result['greedy_targets']} |", flush=True)
  machine = cpu_machine(jnp.float32) if jax.default_backend() == "cpu" else {"backend": jax.default_backend()}
  print(machine_line(machine) if "matmul" in machine else machine)
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump({"results": results, "machine": machine}, f, indent=1)


if __name__ == "__main__":
  define_flags()
  cli.run(main, __doc__, flag_modules=(__name__,))
