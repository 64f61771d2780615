r"""Converts a PyTorch / GGUF checkpoint into an s2sjax (orbax) checkpoint.

  python -m checkpoints_conversion.convert --source=DIR_OR_GGUF --output=DIR \
      [--family=auto|FAMILY|LAYOUT] [--dtype=float32|bfloat16] [--trust_remote_code] [--verify]

The source's config.json `model_type` picks the family layout that reads it (`s2sjax.families`). `--family`
only checks that choice: `auto` takes any; a family name (qwen2, llama, glm4) any of that family's layouts; a
vendor layout name (baichuan_audio, chatglm) that layout only. The values are the registry's, so a family
registered through $S2SJAX_PLUGINS is accepted too.

Every key and shape is checked against the abstract target tree before anything is written; tensors are then
read, transformed and written one leaf at a time. Modules a layout knows scoring never runs (Baichuan-Audio's
audio tokenizer, vision towers) are left out without flags, listed in the manifest and named in the report the
command prints, with what each is and where a user gets it instead (`report`).

Moshi releases (`--family=moshi`) are read in the releases' fused attention keys or today's `LMModel.state_dict()`
names, LoRA factors merged into the weights they adapt (`s2sjax.families.moshi.LMStateDict`).

A tokenizer that is remote code (tokenizer_config.json's `auto_map`, as GLM-4's `ChatGLM4Tokenizer`) is run only
with --trust_remote_code; its code and model files are then copied with the checkpoint, as the source ships them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import Iterator, Sequence

import jax.numpy as jnp
import numpy as np
from absl import flags, logging

from checkpoints_conversion import safetensors_io
from checkpoints_conversion.sources import TensorSource, open_source
from s2sjax import checkpoint, cli, families, text_tokenizer
from s2sjax.progress import Progress
from s2sjax.families import moshi as moshi_family
from s2sjax.families.keymap import Rule, check_rules
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import abstract_params

TOKENIZER_FILES = (
  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
  "tokenizer.model", "added_tokens.json",
)


class ConversionError(ValueError):
  """The source does not fit the target: every problem found is listed."""


@dataclasses.dataclass
class Plan:
  source: TensorSource
  model_type: str
  layout: families.Layout
  config: ModelConfig
  rules: list[Rule]
  kept: list[str]
  skipped: list[str]  # by --skip_prefix and by the layout's own skipped_prefixes
  skipped_modules: dict[str, int]  # the layout's skipped prefixes found in the source: how many keys each


# Parallel-stream families: their own parameter tree and checkpoint writer (s2sjax/families/moshi.py says why).
STREAM_FAMILIES = (moshi_family.NAME,)


def family_choices() -> tuple[str, ...]:
  """--family's values: auto, then the registry's families and vendor layouts, then the stream families."""
  return ("auto",) + families.layout_choices() + STREAM_FAMILIES


def _source_layout(source: TensorSource, family: str) -> tuple[str, families.Layout]:
  """The source's model_type and the layout that reads it, checked against --family."""
  model_type = source.config.get("model_type")
  if family not in family_choices():
    raise ConversionError(f"unknown --family {family!r}; supported: {', '.join(family_choices())}")
  if model_type not in families.model_types(None if family == "auto" else family):
    raise ConversionError(
      f"{source.description}: model_type {model_type!r} is not supported for --family={family}; "
      f"supported families (config model_type): {families.describe()}"
    )
  return model_type, families.layout_for_model_type(model_type)


def plan_conversion(source: TensorSource, family: str = "auto", skip_prefixes: Sequence[str] = ()) -> Plan:
  """Checks every key and shape of the source against the target tree; raises ConversionError listing all
  missing, unexpected and mis-shaped keys. Reads no tensor data."""
  model_type, layout = _source_layout(source, family)
  config = layout.parse_config(source.config)
  rules = layout.rules(config, source.config)
  abstract = dict(checkpoint.flatten(abstract_params(config)))
  problems, rest = check_rules(set(abstract), rules, {key: source.shape(key) for key in source.keys()})
  ignored = [k for k in rest if k.endswith(layout.ignored_suffixes)]
  kept = [k for k in rest if k.startswith(layout.kept_prefixes)]
  skipped = [k for k in rest if k.startswith(tuple(skip_prefixes) + layout.skipped_prefixes)]
  modules = {p: sum(k.startswith(p) for k in skipped) for p in layout.skipped_prefixes}
  unexpected = sorted(set(rest) - set(ignored) - set(kept) - set(skipped))
  if unexpected:
    shown = "\n    ".join(unexpected[:50]) + ("\n    ..." if len(unexpected) > 50 else "")
    problems.append(
      f"{len(unexpected)} unexpected key(s) that no rule uses (pass --skip_prefix=... to leave them out "
      f"deliberately):\n    {shown}"
    )
  if problems:
    raise ConversionError(
      f"{source.description} does not fit a {config.family} target ({layout.name} layout of model_type "
      f"{model_type}):\n  " + "\n  ".join(problems)
    )
  return Plan(source, model_type, layout, config, rules, kept, skipped, {p: n for p, n in modules.items() if n})


def with_progress(leaves: Iterator[tuple[tuple[str, ...], np.ndarray]], total: int, description: str
                  ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """The leaves, drawing progress as they are written (tensors, MB/s, ETA)."""
  progress = Progress(total, description, unit="tensors", rate_unit="MB")
  for path, array in leaves:
    yield path, array
    progress.update(1, array.nbytes // 2**20)


def iter_leaves(plan: Plan, dtype) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(stored path, array) for each leaf in the checkpoint's disk layout (layers one at a time), reading only
  that leaf's source tensor."""
  abstract = dict(checkpoint.flatten(abstract_params(plan.config, param_dtype=dtype)))
  for index, rule in enumerate(plan.rules, 1):
    target = abstract[rule.target]
    layer_shape = rule.per_layer_shape(target.shape)
    logging.info("[%d/%d] %s %s %s", index, len(plan.rules), "/".join(rule.target), target.shape, target.dtype)
    for i, piece in enumerate(rule.pieces):
      path = ("layers", str(i)) + rule.target[1:] if rule.stacked else rule.target
      yield path, rule.to_target(plan.source.read(piece.key), piece, layer_shape).astype(target.dtype)


def _tokenizer_dir(source_path: str, vocab_size: int, staging: str,
                   trust_remote_code: bool = False) -> tuple[str | None, dict]:
  """A directory with the source's tokenizer, or None, and what the manifest records of it; checks the tokenizer
  fits the embedding. Transformers' own classes are re-saved; remote code is copied file for file."""
  from transformers import AutoTokenizer

  out = os.path.join(staging, "tokenizer")
  if os.path.isfile(source_path):  # GGUF carries its tokenizer in its metadata
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(source_path), gguf_file=os.path.basename(source_path))
    code = []
  else:
    present = [name for name in TOKENIZER_FILES if os.path.exists(os.path.join(source_path, name))]
    if not present:
      logging.warning("%s has no tokenizer files: the checkpoint is written without tokenizer/, and evaluating it "
                      "needs --tokenizer_dir (the tokenizer it was trained with)", source_path)
      return None, {"note": "none in the source: evaluate with --tokenizer_dir"}
    # its code is copied with the checkpoint, and evaluating it needs the flag too
    code = text_tokenizer.check_trusted(source_path, trust_remote_code, f"{source_path}'s tokenizer")
    missing = [name for name in code if not os.path.exists(os.path.join(source_path, name))]
    if missing:
      raise ConversionError(f"{source_path}: tokenizer_config.json's auto_map names {missing}, which the folder lacks")
    tokenizer = AutoTokenizer.from_pretrained(source_path, trust_remote_code=trust_remote_code)
  if len(tokenizer) > vocab_size:
    raise ConversionError(
      f"the tokenizer has {len(tokenizer)} tokens but the embedding table only {vocab_size} rows: "
      "ids beyond the table would be silently clamped"
    )
  record = {"class": type(tokenizer).__name__, "size": len(tokenizer), "remote_code": code}
  if code:  # the class's own save may not write its code: the folder is copied as the source ships it
    vocab_files = list(getattr(tokenizer, "vocab_files_names", {}).values())
    names = sorted(set(present + code + [n for n in vocab_files if os.path.exists(os.path.join(source_path, n))]))
    os.makedirs(out)
    for name in names:
      shutil.copy(os.path.join(source_path, name), out)
    record["files"] = names
  else:
    tokenizer.save_pretrained(out)
  return out, record


def convert(
  source_path: str,
  output: str,
  family: str = "auto",
  dtype: str = "float32",
  skip_prefixes: Sequence[str] = (),
  overwrite: bool = False,
  trust_remote_code: bool = False,
) -> dict:
  """Converts and writes; returns the manifest (what was read, kept, skipped)."""
  if family in STREAM_FAMILIES:
    return convert_moshi(source_path, output, dtype, overwrite)
  start = time.time()
  source = open_source(source_path)
  plan = plan_conversion(source, family, skip_prefixes)
  target_dtype = jnp.dtype(dtype)
  with tempfile.TemporaryDirectory() as staging:
    tokenizer_dir, tokenizer_record = _tokenizer_dir(source_path, plan.config.vocab_size, staging, trust_remote_code)
    manifest = {
      "source": os.path.abspath(source_path),
      "source_description": source.description,
      "source_model_type": plan.model_type,
      "source_config": source.config,
      "dtype": str(target_dtype),
      "kept_as_extras": plan.kept,
      "skipped": plan.skipped,
      "skipped_modules": plan.skipped_modules,
      "tokenizer": tokenizer_record,
      "trust_remote_code": trust_remote_code,
    }
    extras = ((tuple(key.split(".")), np.asarray(source.read(key))) for key in plan.kept)
    leaves = with_progress(iter_leaves(plan, target_dtype), sum(len(rule.pieces) for rule in plan.rules),
                           f"converting {os.path.basename(os.path.normpath(source_path))}")
    checkpoint.write_checkpoint(
      output, plan.config, leaves, extras=extras, tokenizer_dir=tokenizer_dir,
      manifest=manifest, overwrite=overwrite,
    )
  logging.info("wrote %s in %.1fs (%d kept, %d skipped)", output, time.time() - start, len(plan.kept), len(plan.skipped))
  return manifest


def _moshi_files(source_path: str, source_config: dict) -> list[str]:
  """The release's LM weights (config.json's `moshi_name`), then, with `lora: true`, its LoRA factors (`lora_name`,
  as Kyutai's loader reads them on top: moshi/models/loaders.py l.229, l.260)."""
  files = [os.path.join(source_path, source_config.get("moshi_name", moshi_family.MOSHI_NAME))]
  if source_config.get("lora") and source_config.get("lora_name"):
    files.append(os.path.join(source_path, source_config["lora_name"]))
  for path, key in zip(files, ("moshi_name", "lora_name")):
    if not os.path.exists(path):
      raise ConversionError(f"{path} (config.json's {key}) does not exist")
  return files


def report(manifest: dict, output: str) -> str:
  """What the command prints: the conversion, then each module of the release it left out, what that module is
  and where a user gets it instead, and any LoRA factors merged."""
  lines = [f"converted {manifest['source_description']} -> {output} ({manifest['dtype']})"]
  skipped = manifest.get("skipped_modules") or {}
  notes = families.layout_for_model_type(manifest["source_model_type"]).skipped_notes if skipped else {}
  for prefix, count in skipped.items():
    what = notes.get(prefix, "a module scoring does not run")
    lines.append(f"left out {prefix}* ({count} tensor{'' if count == 1 else 's'}): {what}")
  if manifest.get("lora_merged"):
    merged = manifest["lora_merged"]
    lines.append(f"merged LoRA factors into {len(merged['weights'])} weights (W + {merged['scaling']} * B @ A)")
  return "\n".join(lines)


def convert_moshi(source_path: str, output: str, dtype: str = "float32", overwrite: bool = False) -> dict:
  """A Moshi PyTorch release folder (config.json of LMModel arguments; the LM's safetensors named by its
  `moshi_name`, default model.safetensors, in the release's fused attention keys or today's `LMModel.state_dict()`
  names; with `lora: true` the LoRA factors of `lora_name`; its sentencepiece model named by `tokenizer_name`;
  Mimi's file beside them is not read) -> a Moshi checkpoint, with the text tokenizer as tokenizer/. LoRA factors
  are merged into their weights. Every key and shape is checked before any tensor is read."""
  config_path = os.path.join(source_path, "config.json")
  if not os.path.exists(config_path):
    raise ConversionError(f"{source_path} has no config.json (the LMModel arguments of the release)")
  with open(config_path) as f:
    source_config = json.load(f)
  paths = _moshi_files(source_path, source_config)
  try:
    config = moshi_family.parse_config(source_config)
  except ValueError as e:
    raise ConversionError(f"{source_path}: {e}") from e
  files, problems = {}, []
  for path in paths:
    source = safetensors_io.SafetensorsFile(path)
    for key in source.keys():
      if key in files:
        problems.append(f"{key} is in both {files[key].path} and {path}")
      files.setdefault(key, source)
  state = moshi_family.LMStateDict(config, {k: f.shape(k) for k, f in files.items()}, lambda k: files[k].read(k),
                                   source_config.get("lora_scaling", moshi_family.LORA_SCALING))
  ruled, found, skipped = moshi_family.plan(config, state)
  problems += found
  if source_config.get("lora") and not state.lora:
    problems.append(f"config.json says lora=true, but {' and '.join(paths)} hold no LoRA factors (Kyutai's loader "
                    "would add randomly initialised ones)")
  weights = " + ".join(paths)
  if problems:
    raise ConversionError(f"{weights} does not fit a moshi target:\n  " + "\n  ".join(problems))
  with tempfile.TemporaryDirectory() as staging:
    tokenizer_dir, tokenizer_record = _sentencepiece_tokenizer_dir(source_path, source_config, config.text_card,
                                                                   staging)
    manifest = {"source": os.path.abspath(source_path), "source_description": f"{weights} (Moshi release)",
                "source_model_type": moshi_family.NAME, "source_config": source_config, "dtype": dtype,
                "skipped": skipped, "tokenizer": tokenizer_record}
    if state.lora:
      manifest["lora_merged"] = {"scaling": state.lora_scaling, "weights": sorted(state.lora)}
    leaves = with_progress(moshi_family.convert_leaves(config, ruled, state.read, jnp.dtype(dtype)), len(ruled),
                           f"converting {os.path.basename(os.path.normpath(source_path))}")
    checkpoint.write_checkpoint(output, config, leaves, tokenizer_dir=tokenizer_dir, manifest=manifest,
                                overwrite=overwrite)
  return manifest


# Moshi's text tokenizer is a bare sentencepiece model; this transformers class runs exactly
# `SentencePieceProcessor.encode` once its bos / eos / sep / pad are unset (it adds no tokens of its own).
SENTENCEPIECE_CLASS = "BertGenerationTokenizer"


def _sentencepiece_tokenizer_dir(source_path: str, source_config: dict, text_card: int,
                                 staging: str) -> tuple[str | None, dict]:
  """A transformers-loadable tokenizer folder around the release's sentencepiece model (config.json's
  `tokenizer_name`), or None when the release has none; refuses one with more pieces than the text stream's ids."""
  import sentencepiece

  name = source_config.get("tokenizer_name")
  path = os.path.join(source_path, name) if name else None
  if path is None or not os.path.exists(path):
    logging.warning("%s has no text tokenizer (config.json's tokenizer_name: %s): the checkpoint is written without "
                    "tokenizer/, and evaluating it needs --tokenizer_dir", source_path, name)
    return None, {"note": "none in the source: evaluate with --tokenizer_dir"}
  model = sentencepiece.SentencePieceProcessor(model_file=path)
  if model.get_piece_size() > text_card:
    raise ConversionError(f"{path} has {model.get_piece_size()} pieces, but the text stream takes ids below "
                          f"text_card={text_card}: ids past it would be read as other tokens")
  out = os.path.join(staging, "tokenizer")
  os.makedirs(out)
  shutil.copy(path, os.path.join(out, "spiece.model"))  # the file name the class reads
  unk = model.id_to_piece(model.unk_id()) if model.unk_id() >= 0 else None
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": SENTENCEPIECE_CLASS, "unk_token": unk, "bos_token": None, "eos_token": None,
               "sep_token": None, "pad_token": None}, f, indent=2)
  return out, {"class": SENTENCEPIECE_CLASS, "size": model.get_piece_size(), "source_file": name}


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when this module is the program (libraries import it freely)."""
  flags.DEFINE_string("source", None, "Hugging Face model directory (safetensors or pytorch_model*.bin) or a .gguf file.")
  flags.DEFINE_string("output", None, "Directory to write the s2sjax checkpoint to.")
  flags.DEFINE_enum("family", "auto", family_choices(),
                    "Model family or vendor layout the source must be; auto reads config.json's model_type.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter dtype of the output (norms stay fp32).")
  flags.DEFINE_multi_string("skip_prefix", [], "Leave out source keys with this prefix (listed in the manifest).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing output directory.")
  flags.DEFINE_bool("trust_remote_code", False,
                    "Run a tokenizer shipped as code (tokenizer_config.json auto_map); its code is copied along.")
  flags.DEFINE_bool("verify", False, "Compare per-token log-probs with the PyTorch model (needs torch).")
  flags.DEFINE_integer("verify_length", 512, "Tokens in the --verify comparison.")


def main(argv):
  del argv
  manifest = convert(FLAGS.source, FLAGS.output, FLAGS.family, FLAGS.dtype, FLAGS.skip_prefix, FLAGS.overwrite,
                     FLAGS.trust_remote_code)
  print(report(manifest, FLAGS.output))
  if FLAGS.verify:
    from checkpoints_conversion import verify

    result = verify.compare_with_torch(FLAGS.source, FLAGS.output, length=FLAGS.verify_length)
    print(
      f"verify: {result['tokens']} tokens, max |log-prob difference| = {result['max_abs_diff']:.3g} "
      f"(mean {result['mean_abs_diff']:.3g}) in {result['dtype']}"
    )


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["source", "output"])
  cli.run(main)
