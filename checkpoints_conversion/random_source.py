r"""A transformers model folder of a published shape with random weights: the benchmark's reference side on a
machine that holds no real weights (an accelerator host with no network).

  python -m checkpoints_conversion.random_source --shape=qwen2.5-0.5b --output=HF_DIR
  python -m checkpoints_conversion.convert --source=HF_DIR --output=CKPT
  python -m s2sjax.bench --checkpoint=CKPT --workload=stories,speech --dtype=bfloat16

The config.json is the exporter's (`export_hf.hf_config`) for the planner's shape, so transformers builds the same
architecture s2sjax converts back; weights are transformers' own initialisation, seeded.
"""

from __future__ import annotations

from absl import flags

from checkpoints_conversion.export_hf import hf_config
from s2sjax.runtime import cli
from s2sjax.scoring import planner


def write(shape: str, output: str, seed: int = 0) -> str:
  """Writes config.json and model.safetensors (fp32) of `shape` with random weights to `output`."""
  import torch
  import transformers

  shapes = planner.named_models()
  if shape not in shapes:
    raise ValueError(f"unknown shape {shape!r}; known: {sorted(shapes)}")
  fields = hf_config(shapes[shape], None, "float32")
  fields.pop("architectures")
  config = transformers.AutoConfig.for_model(**fields)
  torch.manual_seed(seed)
  transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(output)
  return output


FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_enum("shape", "qwen2.5-0.5b", sorted(planner.named_models()), "Published architecture (s2sjax.plan's shapes).")
  flags.DEFINE_string("output", None, "Hugging Face directory to write.")
  flags.DEFINE_integer("seed", 0, "torch seed of the initialisation.")
  flags.mark_flag_as_required("output")


def main(argv):
  del argv
  print(f"{FLAGS.shape} with random weights -> {write(FLAGS.shape, FLAGS.output, FLAGS.seed)}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
