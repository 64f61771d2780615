"""A tiny random model that shares the real Qwen2.5 tokenizer, and the bundled sample built for it."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np

from checkpoints_conversion.convert import convert
from s2sjax.scoring.checkpoints import checkpoint
from tasks.preparation import prepare
from tests.hf_models import save_hf, tiny_model


def tiny_checkpoint(directory: str, tokenizer_dir: str) -> str:
  """A 2-layer qwen2 whose embedding covers the Qwen2.5 tokenizer, converted, with the tokenizer beside it."""
  hf = save_hf(tiny_model("qwen2", vocab_size=151_680, hidden_size=32, intermediate_size=64, num_hidden_layers=2),
               os.path.join(directory, "hf"))
  for name in os.listdir(tokenizer_dir):
    shutil.copy(os.path.join(tokenizer_dir, name), hf)
  out = os.path.join(directory, "ckpt-100")
  convert(hf, out)
  return out


def later_steps(first: str, steps: tuple[int, ...], root: str | None = None) -> list[str]:
  """Copies of a checkpoint with perturbed weights (normal noise of scale 0.02, drawn from the step), named like a
  training run's later steps (beside it, or in `root`). NumPy draws the noise: jax.random's first draw over the
  151,680-row tables takes seconds of compiling and threefry on a CPU, a tenth of a second here."""
  config, params = checkpoint.load_config(first), checkpoint.load_params(first)
  paths = []
  for step in steps:
    noise = np.random.default_rng(step)
    perturbed = jax.tree.map(lambda x: x + 0.02 * noise.standard_normal(x.shape, np.float32).astype(x.dtype), params)
    path = os.path.join(root or os.path.dirname(first), f"ckpt-{step}")
    checkpoint.save_params(path, config, perturbed, tokenizer_dir=os.path.join(first, "tokenizer"))
    paths.append(path)
  return paths


def build_sample(data_dir: str, tokenizer_dir: str, tasks=("sstorycloze", "zh_sstorycloze", "scmmlu"),
                 modalities=("t2t", "s2t")) -> None:
  for task in tasks:
    for modality in modalities:
      prepare(task, "demo", modality, 1024, data_dir, tokenizer_dir=tokenizer_dir)


def same_tree(a: str, b: str, skip=("chunks",)) -> list[str]:
  """Relative paths whose bytes differ between two output trees (plots excluded: they embed metadata)."""
  differ = []
  for root, _, files in os.walk(a):
    if any(part in skip for part in os.path.relpath(root, a).split(os.sep)):
      continue
    for name in files:
      if name.endswith(".png"):
        continue
      rel = os.path.relpath(os.path.join(root, name), a)
      other = os.path.join(b, rel)
      if not os.path.exists(other) or open(os.path.join(a, rel), "rb").read() != open(other, "rb").read():
        differ.append(rel)
  return differ

