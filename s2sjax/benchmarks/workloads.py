"""The synthetic workloads both benchmarks score (`s2sjax.bench` beside the PyTorch reference,
`s2sjax.benchmarks.accelerator` on one chip) and the s2sjax protocols they lay them with."""

from __future__ import annotations

import numpy as np

from s2sjax.data.packing import Item

WORKLOADS = {
  # prefix mean/std, candidates per item, candidate length range
  "stories": dict(prefix=(60, 8), options=2, candidate=(6, 18)),
  "speech": dict(prefix=(200, 20), options=4, candidate=(5, 15)),
}
# The s2sjax protocols: flag name -> (table name, share prefixes, item-local attention).
PROTOCOLS = {
  "noshare": ("s2sjax, no sharing", False, False),
  "shared": ("s2sjax, shared", True, False),
  "local": ("s2sjax, shared, item-local", True, True),
}


def make_items(workload: str, count: int, vocab: int, seed: int = 0) -> list[Item]:
  """`count` random items of a workload over a vocabulary of `vocab` ids (the same for a seed)."""
  spec = WORKLOADS[workload]
  rng = np.random.default_rng(seed)
  items = []
  for i in range(count):
    prefix_len = max(8, int(rng.normal(*spec["prefix"])))
    candidates = tuple(rng.integers(0, vocab, rng.integers(*spec["candidate"])) for _ in range(spec["options"]))
    items.append(Item(rng.integers(0, vocab, prefix_len), candidates, name=f"{workload}-{i}"))
  return items
