r"""s2sjax checkpoint -> Hugging Face safetensors (qwen2 and llama), so a model trained in JAX can be published.

  python -m checkpoints_conversion.export_hf --checkpoint=DIR --output=HF_DIR [--max_shard_gb=4]

The inverse of `convert` through the same rule table: the round trip orbax -> HF -> orbax is bit-identical.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
from absl import app, flags

from checkpoints_conversion import layouts, safetensors_io
from s2sjax import checkpoint
from s2sjax.model.config import ModelConfig

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


def hf_config(config: ModelConfig, source_config: dict | None, dtype: str) -> dict:
  """config.json for transformers: the source's own (token ids, templates) with the architecture from ours."""
  out = dict(source_config or {}) if (source_config or {}).get("model_type") == config.family else {}
  out.update(
    architectures=[ARCHITECTURES[config.family]],
    model_type=config.family,
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    intermediate_size=config.intermediate_size,
    num_hidden_layers=config.num_layers,
    num_attention_heads=config.num_heads,
    num_key_value_heads=config.num_kv_heads,
    head_dim=config.head_dim,
    rms_norm_eps=config.rms_norm_eps,
    rope_theta=config.rope_theta,
    tie_word_embeddings=config.tie_embeddings,
    torch_dtype=dtype,
  )
  out.pop("rope_parameters", None)
  if config.family == "llama":
    out.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
  out.pop("quantization_config", None)  # a GGUF source's: the export is plain tensors
  return out


def hf_tensors(config: ModelConfig, params) -> dict[str, np.ndarray]:
  """HF state dict (numpy) from s2sjax params, via the inverse of each conversion rule."""
  if config.family not in ARCHITECTURES or config.audio_codebook_sizes:
    raise ValueError(f"export to Hugging Face supports text-only {', '.join(ARCHITECTURES)} models, not {config.family}")
  leaves = dict(checkpoint.flatten(params))
  tensors = {}
  for rule in layouts.rules_for(config, config.family):
    leaf = np.asarray(leaves[rule.target])
    for i, piece in enumerate(rule.pieces):
      tensors[piece.key] = np.ascontiguousarray(rule.to_source(leaf[i] if rule.stacked else leaf))
  return tensors


def export(ckpt_dir: str, output: str, max_shard_bytes: int = 4 << 30) -> list[str]:
  """Writes config.json, model(-NNNNN-of-NNNNN).safetensors (+ index when sharded) and the tokenizer."""
  config = checkpoint.load_config(ckpt_dir)
  manifest = checkpoint.load_manifest(ckpt_dir)
  params = checkpoint.load_params(ckpt_dir)
  tensors = hf_tensors(config, params)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, array in tensors.items():
    if shards[-1] and size + array.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
  os.makedirs(output, exist_ok=True)
  names = (
    ["model.safetensors"]
    if len(shards) == 1
    else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  )
  for name, shard in zip(names, shards):
    safetensors_io.write(os.path.join(output, name), shard, metadata={"format": "pt"})
  if len(shards) > 1:
    index = {
      "metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
      "weight_map": {key: name for name, shard in zip(names, shards) for key in shard},
    }
    with open(os.path.join(output, "model.safetensors.index.json"), "w") as f:
      json.dump(index, f, indent=2)
  dtype = str(next(iter(tensors.values())).dtype)
  with open(os.path.join(output, "config.json"), "w") as f:
    json.dump(hf_config(config, manifest.get("source_config"), dtype), f, indent=2)
  tokenizer = os.path.join(str(ckpt_dir), "tokenizer")
  if os.path.isdir(tokenizer):
    shutil.copytree(tokenizer, output, dirs_exist_ok=True)
  return names


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when this module is the program (libraries import it freely)."""
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint directory.")
  flags.DEFINE_string("output", None, "Hugging Face directory to write.")
  flags.DEFINE_float("max_shard_gb", 4.0, "Largest safetensors shard, in GiB.")


def main(argv):
  del argv
  names = export(FLAGS.checkpoint, FLAGS.output, int(FLAGS.max_shard_gb * (1 << 30)))
  print(f"exported {FLAGS.checkpoint} -> {FLAGS.output} ({len(names)} safetensors file(s))")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["checkpoint", "output"])
  app.run(main)
