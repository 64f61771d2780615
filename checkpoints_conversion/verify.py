"""`--verify`: the converted model against the PyTorch (transformers) model on the same tokens, for source layouts
whose family declares them `verifiable` (s2sjax.families)."""

from __future__ import annotations

import os

import numpy as np

from s2sjax import checkpoint, families
from s2sjax.families import moshi as moshi_family
from s2sjax.model.decoder import sequence_log_probs


def load_torch_model(source_path: str):
  import torch
  from transformers import AutoModelForCausalLM

  if os.path.isfile(source_path):
    model = AutoModelForCausalLM.from_pretrained(
      os.path.dirname(source_path), gguf_file=os.path.basename(source_path), dtype=torch.float32
    )
  else:
    model = AutoModelForCausalLM.from_pretrained(source_path, dtype=torch.float32)
  return model.eval()


def compare_with_torch(source_path: str, ckpt_dir: str, length: int = 512, seed: int = 0) -> dict:
  """Max and mean |log p_torch - log p_jax| over every vocabulary entry at `length` random token positions, fp32."""
  import torch

  model_type = checkpoint.load_manifest(ckpt_dir)["source_model_type"]
  if model_type == moshi_family.NAME:
    return compare_moshi_with_torch(source_path, ckpt_dir, length, seed)
  if not families.layout_for_model_type(model_type).verifiable:
    verifiable = [t for _, layout in families.all_layouts() if layout.verifiable for t in layout.model_types]
    raise ValueError(
      f"--verify needs the PyTorch model in transformers; {model_type!r} checkpoints need their authors' remote "
      f"code (verifiable model_types: {', '.join(verifiable)})"
    )
  config = checkpoint.load_config(ckpt_dir)
  params = checkpoint.load_params(ckpt_dir, dtype=np.float32)
  tokens = np.random.default_rng(seed).integers(0, config.vocab_size, size=(1, length))
  with torch.no_grad():
    reference = torch.log_softmax(load_torch_model(source_path)(torch.from_numpy(tokens)).logits.float(), -1).numpy()
  ours = np.asarray(sequence_log_probs(config, params, tokens))
  diff = np.abs(ours - reference)
  return {"tokens": length, "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()), "dtype": "float32"}


def load_moshi_lm(source_path: str):
  """Kyutai's own `LMModel` (the `moshi` package) from a release folder, in fp32. Through upstream's loader, which
  reads either attention spelling and, with `lora: true`, the `lora_name` factors on top; a LoRA-wrapped
  `LMModel`'s own state dict (`frozen_W` and the factors in one file, which that loader does not read) is loaded into
  a model wrapped as upstream wraps it (`replace_all_linear_with_lora`)."""
  import json

  import torch
  from moshi.models import loaders
  from moshi.modules.lora import replace_all_linear_with_lora
  from safetensors import safe_open

  with open(os.path.join(source_path, "config.json")) as f:
    config = json.load(f)
  weights = os.path.join(source_path, config.get("moshi_name", moshi_family.MOSHI_NAME))
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
  replace_all_linear_with_lora(model, ranks[0], float(config.get("lora_scaling", moshi_family.LORA_SCALING)))
  model.load_state_dict(load_file(weights))
  return model.eval()


def compare_moshi_with_torch(source_path: str, ckpt_dir: str, length: int = 512, seed: int = 0) -> dict:
  """`compare_moshi_model` against the release's `LMModel` as upstream loads it (`load_moshi_lm`)."""
  return compare_moshi_model(load_moshi_lm(source_path), ckpt_dir, length, seed)


def compare_moshi_model(model, ckpt_dir: str, length: int = 512, seed: int = 0) -> dict:
  """Max and mean |log p_torch - log p_jax| over the text stream's and every predicted codebook's full
  distribution at `length` random steps (some codes -1), where `LMModel.forward` marks them valid; fp32."""
  import torch

  from s2sjax.model.moshi import stream_log_probs

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
