"""Benchmark-like items and the naive reference protocol (one forward per prefix + candidate), shared by tests."""

from __future__ import annotations

import numpy as np

from s2sjax.data.packing import Item


def random_items(count: int, vocab: int, seed: int = 0, audio_placeholder: int | None = None,
                 codebook_sizes: tuple[int, ...] = ()) -> list[Item]:
  """Stories (2 candidates) and four-option items with varied prefix and candidate lengths; with a placeholder,
  the prefix is a spoken span of audio placeholders (codes per codebook) between text tokens."""
  rng = np.random.default_rng(seed)
  items = []
  for i in range(count):
    prefix = rng.integers(0, vocab - 20, rng.integers(12, 90))
    codes = None
    if audio_placeholder is not None:
      codes = np.full((len(prefix), len(codebook_sizes)), -1)
      audio = slice(3, len(prefix) - 2)
      prefix[audio] = audio_placeholder
      codes[audio] = np.stack([rng.integers(0, n, audio.stop - audio.start) for n in codebook_sizes], -1)
    options = 2 if i % 3 else 4
    candidates = tuple(rng.integers(0, vocab - 20, rng.integers(1, 20)) for _ in range(options))
    items.append(Item(prefix, candidates, codes, name=f"item-{i}"))
  return items


def reference_mean_nll(model, items: list[Item], inputs_embeds=None) -> np.ndarray:
  """S2SBench's protocol in PyTorch: each prefix + candidate its own forward, mean cross-entropy over the
  candidate's tokens (the first predicted from the last prefix position). inputs_embeds(tokens, codes) builds
  audio inputs when given. Returns [N, max candidates] with NaN where an item has fewer."""
  import torch

  out = np.full((len(items), max(len(it.candidates) for it in items)), np.nan)
  for i, item in enumerate(items):
    for c, candidate in enumerate(item.candidates):
      tokens = np.concatenate([item.prefix, candidate])[None]
      with torch.no_grad():
        if inputs_embeds is not None:
          codes = np.concatenate([item.prefix_codes, np.full((len(candidate), item.prefix_codes.shape[1]), -1)])[None]
          logits = model(inputs_embeds=inputs_embeds(tokens, codes)).logits
        else:
          logits = model(torch.from_numpy(tokens)).logits
      p = len(item.prefix)
      log_probs = torch.log_softmax(logits[0, p - 1 : -1].double(), -1).numpy()
      out[i, c] = -log_probs[np.arange(len(candidate)), candidate].mean()
  return out
