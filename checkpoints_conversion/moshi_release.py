"""Moshi releases (Kyutai's PyTorch `LMModel` folders) -> s2sjax checkpoints, and `--verify` against upstream's own
model: Moshi's own converter and verifier (registered in own_converters.py), called by
`checkpoints_conversion.convert --family=moshi` and its `--verify`.

A release is read in its fused attention keys or today's `LMModel.state_dict()` names, LoRA factors merged into the
weights they adapt (`moshi_keymap.LMStateDict`); every key and shape is checked before any tensor is read.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import jax.numpy as jnp
import numpy as np
from absl import logging

from checkpoints_conversion import moshi_keymap, safetensors_io
from checkpoints_conversion.convert import ConversionError, interrupts_between_leaves, with_progress
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.architectures import moshi as moshi_family
from s2sjax.model.moshi import stream_log_probs


def _release_files(source_path: str, source_config: dict) -> list[str]:
  """The release's LM weights (config.json's `moshi_name`), then, with `lora: true`, its LoRA factors (`lora_name`,
  as Kyutai's loader reads them on top: moshi/models/loaders.py l.229, l.260)."""
  files = [os.path.join(source_path, source_config.get("moshi_name", moshi_keymap.MOSHI_NAME))]
  if source_config.get("lora") and source_config.get("lora_name"):
    files.append(os.path.join(source_path, source_config["lora_name"]))
  for path, key in zip(files, ("moshi_name", "lora_name")):
    if not os.path.exists(path):
      raise ConversionError(f"{path} (config.json's {key}) does not exist")
  return files


def convert(source_path: str, output: str, dtype: str = "float32", overwrite: bool = False) -> dict:
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
  paths = _release_files(source_path, source_config)
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
  state = moshi_keymap.LMStateDict(config, {k: f.shape(k) for k, f in files.items()}, lambda k: files[k].read(k),
                                   source_config.get("lora_scaling", moshi_keymap.LORA_SCALING))
  ruled, found, skipped = moshi_keymap.plan(config, state)
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
    leaves = with_progress(moshi_keymap.convert_leaves(config, ruled, state.read, jnp.dtype(dtype)), len(ruled),
                           f"converting {os.path.basename(os.path.normpath(source_path))}")
    with interrupts_between_leaves() as between:
      checkpoint.write_checkpoint(output, config, between(leaves), tokenizer_dir=tokenizer_dir, manifest=manifest,
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


def load_lm(source_path: str):
  """Kyutai's own `LMModel` (the `moshi` package) from a release folder, in fp32. Through upstream's loader, which
  reads either attention spelling and, with `lora: true`, the `lora_name` factors on top; a LoRA-wrapped
  `LMModel`'s own state dict (`frozen_W` and the factors in one file, which that loader does not read) is loaded into
  a model wrapped as upstream wraps it (`replace_all_linear_with_lora`)."""
  import torch
  from moshi.models import loaders
  from moshi.modules.lora import replace_all_linear_with_lora
  from safetensors import safe_open

  with open(os.path.join(source_path, "config.json")) as f:
    config = json.load(f)
  weights = os.path.join(source_path, config.get("moshi_name", moshi_keymap.MOSHI_NAME))
  lm_kwargs = {k: v for k, v in config.items() if k not in moshi_family.LOADER_KEYS}
  lora_name = config.get("lora_name") if config.get("lora") else None
  lora_weights = os.path.join(source_path, lora_name) if lora_name else None
  with safe_open(weights, "pt") as f:
    ranks = [f.get_slice(k).get_shape()[0] for k in f.keys() if k.endswith(".lora_A.weight")]
  if not ranks or lora_weights:
    return loaders.get_moshi_lm(weights, lm_kwargs=lm_kwargs, device="cpu", dtype=torch.float32,
                                lora_weights=lora_weights).eval()
  from safetensors.torch import load_file

  model = loaders.get_moshi_lm(None, lm_kwargs={k: v for k, v in lm_kwargs.items() if k not in moshi_family.LORA_KEYS},
                               device="cpu", dtype=torch.float32)
  replace_all_linear_with_lora(model, ranks[0], float(config.get("lora_scaling", moshi_keymap.LORA_SCALING)))
  model.load_state_dict(load_file(weights))
  return model.eval()


def compare_with_torch(source_path: str, ckpt_dir: str, length: int = 512, seed: int = 0) -> dict:
  """`compare_model` against the release's `LMModel` as upstream loads it (`load_lm`)."""
  return compare_model(load_lm(source_path), ckpt_dir, length, seed)


def compare_model(model, ckpt_dir: str, length: int = 512, seed: int = 0) -> dict:
  """Max and mean |log p_torch - log p_jax| over the text stream's and every predicted codebook's full
  distribution at `length` random steps (some codes -1), where `LMModel.forward` marks them valid; fp32."""
  import torch

  config, params = checkpoint.load_config(ckpt_dir), checkpoint.load_params(ckpt_dir)
  rng = np.random.default_rng(seed)
  codes = np.concatenate([rng.integers(0, config.text_card, (1, 1, length)),
                          rng.integers(0, config.card, (1, config.n_q, length))], axis=1)
  codes[:, :, rng.random(length) < 0.02] = -1  # upstream's zero token, embedded as nothing
  with torch.no_grad():
    out = model(torch.from_numpy(codes))
  text, text_mask, audio, audio_mask = stream_log_probs(config, params, codes)
  diffs = [np.abs(text - torch.log_softmax(out.text_logits.float(), -1).numpy()[:, 0])[text_mask]]
  if audio is not None:
    diffs.append(np.abs(audio - torch.log_softmax(out.logits.float(), -1).numpy())[audio_mask])
  diff = np.concatenate([d.ravel() for d in diffs])
  return {"tokens": length, "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()), "dtype": "float32"}
