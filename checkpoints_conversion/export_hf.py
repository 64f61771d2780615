r"""s2sjax checkpoint -> Hugging Face safetensors, so a model trained in JAX can be published (families that declare
an `export`: s2sjax.model.families).

  python -m checkpoints_conversion.export_hf --checkpoint=DIR --output=HF_DIR [--max_shard_gb=4]

The inverse of `convert` through the same rule table: the round trip orbax -> HF -> orbax is bit-identical.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
from absl import flags

from checkpoints_conversion import safetensors_io
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model import families
from s2sjax.runtime import cli
from s2sjax.runtime.errors import UserError
from s2sjax.model.config import ModelConfig


class ExportError(UserError, ValueError):
  """A model that has no transformers counterpart to be written as."""


def _export(config: ModelConfig) -> families.HfExport:
  export = families.get(config.family).export
  if export is None:
    exportable = [name for name in families.names() if families.get(name).export]
    raise ExportError(
      f"model family {config.family} has no transformers architecture to export to (exportable: "
      f"{', '.join(exportable)}); keep the s2sjax checkpoint, or give the family an `export` in its module"
    )
  return export


def hf_config(config: ModelConfig, source_config: dict | None, dtype: str) -> dict:
  """config.json for transformers: the source's own (token ids, templates) with the architecture from ours."""
  export = _export(config)
  fields = export.config(config)
  out = dict(source_config or {}) if (source_config or {}).get("model_type") == fields["model_type"] else {}
  out.pop("rope_parameters", None)  # ours is written as top-level rope_theta
  out.pop("quantization_config", None)  # a GGUF source's: the export is plain tensors
  out.update(fields, architectures=[export.architecture], torch_dtype=dtype)
  return out


def hf_tensors(config: ModelConfig, params) -> dict[str, np.ndarray]:
  """HF state dict (numpy) from s2sjax params, via the inverse of each rule of the family's export layout."""
  export = _export(config)
  rules = families.get(config.family).layout(export.layout).rules(config, {})
  leaves = dict(checkpoint.flatten(params))
  unplaced = sorted("/".join(path) for path in leaves.keys() - {rule.target for rule in rules})
  if unplaced:  # audio tables, say: writing the rest would silently drop them
    raise ExportError(f"{export.architecture} has no place for {', '.join(unplaced)}; only text decoders export")
  tensors = {}
  for rule in rules:
    leaf = np.asarray(leaves[rule.target])
    for i, piece in enumerate(rule.pieces):
      if piece.rows is not None or piece.normalize_rows:
        raise ExportError(f"{piece.key} is a fused or normalised tensor: the export layout must store each leaf as is")
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
  cli.run(main)
