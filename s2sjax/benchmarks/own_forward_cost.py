r"""What scoring through a model's own forward costs against the shared-prefix step, on the same rows and model.

  python -m s2sjax.benchmarks.own_forward_cost [--workload=sample|stories|storycloze] [--items=N] \
      [--storycloze_csv=CSV] [--checkpoint=DIR] [--batch_size=2] [--own_batch_size=2] [--output=FILE.json]

`sample`: the bundled sample's StoryCloze T->T build (demo spec; built on first use, as `s2sjax.eval` builds it);
`stories`: N synthetic StoryCloze-like items (s2sjax/benchmarks/workloads.py); `storycloze`: the first N stories of the
StoryCloze 2016 test CSV. The model is the checkpoint's (default: the embedded SmolLM2-135M). Both paths score
the same built rows: the shared-prefix step (`Scorer`, item-local attention as `s2sjax.eval --attention=auto`
runs it on a CPU) and the decoder as its own forward (`own_forward.decoder_forward`: the rows laid again one
candidate a segment, segment-causal attention, the full head). Printed and written: rows, positions computed
(rows x length, whole steps), tokens laid, wall seconds after one warm-up step each, and the largest difference in
any candidate's mean NLL. A benchmark, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import json
import math
import os
import time

import jax.numpy as jnp
import numpy as np
from absl import flags

from s2sjax.scoring import default_model
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.runtime import cli
from s2sjax.benchmarks.workloads import make_items
from s2sjax.benchmarks.machine import cpu_machine, machine_line
from s2sjax.benchmarks.workloads import row_shape, storycloze_items
from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.scoring.own_forward import OwnForwardScorer, decoder_forward
from s2sjax.data.packing import fit, pack
from s2sjax.scoring.scorer import Scorer, collect
from s2sjax.data.spec import load_spec
from tasks.preparation import default_data_dir, prepare

FLAGS = flags.FLAGS


def sample_rows(ckpt: str) -> tuple[dict, object]:
  """The bundled sample's StoryCloze T->T rows (built into the default data folder on first use) and their shape."""
  from s2sjax.data.task_data import load_task_data

  data_dir = default_data_dir()
  prepare("sstorycloze", "demo", "t2t", None, data_dir, tokenizer_dir=os.path.join(ckpt, "tokenizer"))
  td = load_task_data(data_dir, "sstorycloze", "t2t", "demo", None)
  return td.rows, td.shape


def item_rows(items) -> tuple[dict, object]:
  """Items packed as a build packs them: prefixes shared, rows of the auto length, tables fitted."""
  rows, report = pack(items, row_shape(items, None, True), share_prefix=True)
  return fit(rows, row_shape(items, None, True), report.longest_item)


def timed(scorer, params, rows) -> tuple[dict, float]:
  """(nll_sum, n_tokens) of every row and the wall seconds, after one untimed step (its compile)."""
  scorer.score(params, {k: v[: scorer.batch_size] for k, v in rows.items()}, progress=False)
  start = time.time()
  nll_sum, n_tokens = scorer.score(params, rows, progress=False)
  return {"nll_sum": nll_sum, "n_tokens": n_tokens}, time.time() - start


def measure(workload: str, ckpt: str, count: int, batch_size: int, own_batch_size: int,
            storycloze_csv: str | None = None) -> dict:
  config = checkpoint.load_config(ckpt)
  params = checkpoint.load_params(ckpt, dtype=jnp.float32)
  if workload == "sample":
    config, params = default_model.fit_to_spec(config, params, load_spec("demo"), checkpoint.load_manifest(ckpt))
    rows, shape = sample_rows(ckpt)
  elif workload == "storycloze":
    rows, shape = item_rows(storycloze_items(storycloze_csv, count, ckpt))
  else:
    rows, shape = item_rows(make_items(workload, count, config.vocab_size))
  shared = Scorer(config, shape, batch_size=batch_size, attention="xla")
  own = OwnForwardScorer(decoder_forward(config), shape, batch_size=own_batch_size)
  laid, _ = own.laid(rows)
  results = {}
  for name, scorer, scored_rows in (("shared prefix, item-local (xla)", shared, rows),
                                    ("own forward, one candidate a segment", own, laid)):
    sums, seconds = timed(scorer, params, rows)
    count_rows = len(scored_rows["segment_ids"])
    results[name] = {
      "rows": count_rows, "seconds": seconds, "sums": sums,
      "positions_computed": math.ceil(count_rows / scorer.batch_size) * scorer.batch_size * shape.length,
      "tokens_laid": int((scored_rows["segment_ids"] > 0).sum()),
    }
  first, second = (collect(rows, r["sums"]["nll_sum"], r["sums"]["n_tokens"]).mean_nll for r in results.values())
  for r in results.values():
    del r["sums"]
  return {"workload": workload, "items": len(np.unique(rows["slot_item"][rows["slot_item"] >= 0])), "row_length": shape.length, "vocab": config.vocab_size,
          "batch_sizes": [shared.batch_size, own.batch_size], "max_mean_nll_diff": float(np.nanmax(np.abs(first - second))),
          "results": results, "machine": cpu_machine(jnp.float32)}


def format_table(run: dict) -> str:
  base = next(iter(run["results"].values()))
  lines = [f"{run['workload']}: {run['items']} items, rows of {run['row_length']}, vocab {run['vocab']}",
           "| path | rows | positions computed | vs shared | tokens laid | vs shared | wall s | vs shared |",
           "|---|---|---|---|---|---|---|---|"]
  for name, r in run["results"].items():
    lines.append(f"| {name} | {r['rows']} | {r['positions_computed']:,} | "
                 f"{r['positions_computed'] / base['positions_computed']:.2f}x | {r['tokens_laid']:,} | "
                 f"{r['tokens_laid'] / base['tokens_laid']:.2f}x | {r['seconds']:.1f} | "
                 f"{r['seconds'] / base['seconds']:.2f}x |")
  lines.append(f"max |mean NLL difference| {run['max_mean_nll_diff']:.2g}; {machine_line(run['machine'])}")
  return "\n".join(lines)


def main(argv) -> None:
  del argv
  ckpt = FLAGS.checkpoint or default_checkpoint()
  run = measure(FLAGS.workload, ckpt, FLAGS.items, FLAGS.batch_size, FLAGS.own_batch_size, FLAGS.storycloze_csv)
  print(format_table(run))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump(run, f, indent=2)


if __name__ == "__main__":
  flags.DEFINE_enum("workload", "sample", ["sample", "stories", "storycloze"], "Which items (module docstring).")
  flags.DEFINE_integer("items", 96, "stories / storycloze: how many items.")
  flags.DEFINE_string("storycloze_csv", None, "StoryCloze Spring 2016 test CSV, for --workload=storycloze.")
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint (default: the embedded SmolLM2-135M).")
  flags.DEFINE_integer("batch_size", 2, "Rows per step of the shared-prefix path (2 is fastest on a CPU).")
  flags.DEFINE_integer("own_batch_size", 2, "Rows per step of the own forward: its full logits are [rows, L, vocab].")
  flags.DEFINE_string("output", None, "JSON file for the results.")
  cli.run(main, __doc__)
