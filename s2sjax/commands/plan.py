r"""Plans an evaluation before it runs: memory per chip, a mesh that fits, and the time for the whole S2SBench.

  python -m s2sjax.plan --model=qwen2.5-7b|--checkpoint=DIR --topology=v5e-8 [--row_length=2048] [--batch=8] \
      [--dtype=bfloat16] [--frame_rate=12.5] [--mfu=0.4]

Memory per chip = parameters (split over the `model` axis) + the scoring step's activations for the rows a chip
holds, at the larger of its two phases (`activation_bytes`); it agrees with XLA's own memory analysis of the
compiled step within 20% (tests). Time = the benchmark's FLOPs / (chips x peak x MFU).

Any architecture that says what its step costs is planned (s2sjax/scoring/architectures, `planned`: the shared-decoder shape
its step runs; its parameters are all held): the families' decoders, Kimi-Audio (its main stack and text head, with
the audio branch held but not run). Named shapes are the families' and the architectures' `planner_shapes`.

`s2sjax.eval` asks the same figures before it compiles anything (`check_step_memory`): a step that cannot fit a
device (rows of 16,384 tokens for one long story, `--batch_size=4096`) is refused with them, not after minutes of
compiling.
"""

from __future__ import annotations

from absl import flags

from s2sjax.runtime import cli
from s2sjax.scoring import planner
from s2sjax.scoring.checkpoints import checkpoint


def format_plan(name: str, p: dict) -> str:
  lines = [
    f"{name} on {p['topology']} ({p['chips']} chips x {p['hbm_gib']} GiB)",
    f"  mesh {p['mesh']}, {p['rows_per_chip']} row(s) per chip",
    f"  memory per chip: params {p['params_gib']:.2f} GiB + activations {p['activations_gib']:.2f} GiB = "
    f"{p['total_gib']:.2f} GiB ({'fits' if p['fits'] else 'DOES NOT FIT in 90% of HBM: lower --batch or --row_length'})",
    f"  whole S2SBench, both modalities: {p['benchmark_tflops']:,.0f} TFLOP -> {p['total_seconds'] / 60:.1f} min at "
    f"{p['mfu']:.0%} MFU",
  ]
  lines += [f"    {k:24s} {v:8.1f} s" for k, v in p["seconds"].items()]
  return "\n".join(lines)


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  if FLAGS.checkpoint:
    config, name = checkpoint.load_config(FLAGS.checkpoint), FLAGS.checkpoint
  else:
    config, name = planner.named_models()[FLAGS.model], FLAGS.model
  print(format_plan(name, planner.plan(config, FLAGS.topology, FLAGS.row_length, FLAGS.batch, FLAGS.dtype,
                                       FLAGS.frame_rate, FLAGS.mfu)))


def command_line() -> None:
  """`python -m s2sjax.plan`."""
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint (its model_config.json is read).")
  with cli.setting_up():
    flags.DEFINE_enum("model", "qwen2.5-7b", list(planner.named_models()),
                      "Named architecture (when no --checkpoint).")
  flags.DEFINE_enum("topology", "v5e-8", list(planner.TOPOLOGIES), "TPU slice or GPU host.")
  flags.DEFINE_integer("row_length", 2048, "Packed row length.", lower_bound=1)
  flags.DEFINE_integer("batch", 8, "Rows per step (global).", lower_bound=1)
  flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Parameter and compute dtype.")
  flags.DEFINE_float("frame_rate", 12.5, "Audio tokens per second of speech (12.5 GLM-4-Voice/Mimi, 50 HuBERT).",
                     lower_bound=0.1)
  flags.DEFINE_float("mfu", 0.4, "Assumed model FLOPs utilisation for the time estimate.", lower_bound=0.01,
                     upper_bound=1.0)
  cli.run(main, __doc__, flag_modules=(__name__,))
