r"""Benchmark: peak memory of converting a multi-shard checkpoint, next to the checkpoint's size.

  python -m s2sjax.benchmarks.conversion_memory [--layers=12] [--hidden=2048] [--workdir=/tmp/x]

Writes a random Qwen2-shaped HF checkpoint (fp32, several safetensors shards + index), converts it in a child
process, and prints the child's peak RSS beside the checkpoint bytes and the largest tensor / stacked leaf. The
goal: peak RSS grows with the largest tensor, not the checkpoint (under half the checkpoint's bytes).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from checkpoints_conversion import safetensors_io
from s2sjax.runtime import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_integer("layers", 24, "Decoder layers of the synthetic checkpoint (24 -> 4.5 GiB).")
  flags.DEFINE_integer("hidden", 2048, "Hidden size (heads of 128; 4 kv heads; mlp 2.6875x).")
  flags.DEFINE_integer("vocab", 32000, "Vocabulary size.")
  flags.DEFINE_float("shard_gb", 0.5, "Safetensors shard size in GiB.")
  flags.DEFINE_string("workdir", None, "Where to write (default: a temporary directory, removed afterwards).")


def qwen2_config(layers: int, hidden: int, vocab: int) -> dict:
  return {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
    "intermediate_size": int(hidden * 2.6875), "num_hidden_layers": layers, "num_attention_heads": hidden // 128,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": False,
  }


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
  d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
  kv = config["num_key_value_heads"] * 128
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}"
    shapes.update({
      f"{p}.input_layernorm.weight": (d,), f"{p}.post_attention_layernorm.weight": (d,),
      f"{p}.self_attn.q_proj.weight": (d, d), f"{p}.self_attn.q_proj.bias": (d,),
      f"{p}.self_attn.k_proj.weight": (kv, d), f"{p}.self_attn.k_proj.bias": (kv,),
      f"{p}.self_attn.v_proj.weight": (kv, d), f"{p}.self_attn.v_proj.bias": (kv,),
      f"{p}.self_attn.o_proj.weight": (d, d),
      f"{p}.mlp.gate_proj.weight": (f, d), f"{p}.mlp.up_proj.weight": (f, d), f"{p}.mlp.down_proj.weight": (d, f),
    })
  return shapes


def write_random_checkpoint(directory: str, config: dict, shard_bytes: int) -> int:
  """Shards of random fp32 tensors, generated one shard at a time; returns the total bytes."""
  rng = np.random.default_rng(0)
  shapes = tensor_shapes(config)
  shards: list[list[str]] = [[]]
  size = 0
  for name, shape in shapes.items():
    nbytes = 4 * int(np.prod(shape))
    if shards[-1] and size + nbytes > shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += nbytes
  weight_map = {}
  for i, names in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    tensors = {n: rng.standard_normal(shapes[n], dtype=np.float32) * 0.02 for n in names}
    safetensors_io.write(os.path.join(directory, file), tensors)
    weight_map.update({n: file for n in names})
    del tensors
  total = sum(4 * int(np.prod(s)) for s in shapes.values())
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  return total


def main(argv):
  del argv
  with tempfile.TemporaryDirectory(dir=FLAGS.workdir) as work:
    source, output = os.path.join(work, "hf"), os.path.join(work, "orbax")
    os.makedirs(source)
    config = qwen2_config(FLAGS.layers, FLAGS.hidden, FLAGS.vocab)
    total = write_random_checkpoint(source, config, int(FLAGS.shard_gb * (1 << 30)))
    shapes = tensor_shapes(config)
    largest = max(4 * int(np.prod(s)) for s in shapes.values())
    start = time.time()
    subprocess.run(
      [sys.executable, "-m", "checkpoints_conversion.convert", f"--source={source}", f"--output={output}",
       "--verbosity=-1"], check=True,
    )
    seconds = time.time() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    baseline = subprocess.run(
      [sys.executable, "-c", "import resource, jax, orbax.checkpoint, transformers, flax;"
       "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"],
      check=True, capture_output=True, text=True,
    )
    imports = int(baseline.stdout.split()[-1])
    gib = lambda n: f"{n / (1 << 30):6.2f} GiB"
    print(f"checkpoint      {gib(total)}  ({len(os.listdir(source)) - 2} safetensors shards, fp32)")
    print(f"largest tensor  {gib(largest)}")
    print(f"save batch      {gib(256 << 20)}  (layers stored one at a time, restacked on load)")
    print(f"imports alone   {gib(imports)}  (jax, flax, orbax, transformers)")
    print(f"peak RSS        {gib(peak)}  = {peak / total:.0%} of the checkpoint (goal < 50%)")
    print(f"conversion time {seconds:6.1f} s  ({total / seconds / (1 << 20):.0f} MiB/s)")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
