"""`--verify`: the converted model against the PyTorch (transformers) model on the same tokens, for source layouts
whose family declares them `verifiable` (s2sjax.model.families); a checkpoint of an architecture of its own by that
architecture's verifier hook (s2sjax/scoring/architectures)."""

from __future__ import annotations

import os

import numpy as np

from checkpoints_conversion import own_converters
from s2sjax.scoring import architectures
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model import families
from s2sjax.runtime.errors import UserError
from s2sjax.model.decoder import sequence_log_probs
from s2sjax.runtime.registry import load_object


class VerifyError(UserError, ValueError):
  """A --verify asked of a checkpoint whose source model transformers cannot run."""


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

  architecture = architectures.for_config(checkpoint.load_config(ckpt_dir)).name
  own = own_converters.CONVERTERS.get(architecture) if architecture in own_converters.CONVERTERS.names() else None
  if own and own.verify:
    return load_object(own.verify)(source_path, ckpt_dir, length, seed)
  model_type = checkpoint.load_manifest(ckpt_dir)["source_model_type"]
  if not families.layout_for_model_type(model_type).verifiable:
    verifiable = [t for _, layout in families.all_layouts() if layout.verifiable for t in layout.model_types]
    raise VerifyError(
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
