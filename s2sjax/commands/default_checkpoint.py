r"""The embedded default model converted: on first use into the cache directory ($S2SJAX_CACHE, default
~/.cache/s2sjax), then reused; what `s2sjax.eval`, `s2sjax.lm_eval`, `s2sjax.bench` and `tasks.prepare` run when no
checkpoint (or tokenizer) is named.

  python -m s2sjax.commands.default_checkpoint [--verify]   # prints the converted checkpoint's directory
"""

from __future__ import annotations

import os

from absl import flags

from checkpoints_conversion.convert import convert
from checkpoints_conversion.verify import compare_with_torch
from s2sjax.runtime import cache, cli
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.default_model import CHECKPOINT_NAME, default_gguf
from s2sjax.runtime.output_dir import LOCK_NAME, waiting_lock


def default_checkpoint() -> str:
  """The converted default model's directory, converting it on first use (one run at a time: a second first run
  on the same cache waits for the first's conversion and reuses it)."""
  out = os.path.join(cache.cache_dir(), CHECKPOINT_NAME)
  if _converted(out):
    return out
  with waiting_lock(cache.cache_dir(), f".{CHECKPOINT_NAME}{LOCK_NAME}", "the default model", "conversion"):
    if not _converted(out):  # made by the run this one waited for, if any
      convert(default_gguf(), out, overwrite=True)
  return out


def _converted(path: str) -> bool:
  try:
    checkpoint.load_manifest(path)
    return True
  except checkpoint.CheckpointError:
    return False


def main(argv):
  del argv
  path = default_checkpoint()
  print(path)
  if flags.FLAGS.verify:
    result = compare_with_torch(default_gguf(), path)
    print(f"verify: {result['tokens']} tokens, max |log-prob difference| = {result['max_abs_diff']:.3g}")


if __name__ == "__main__":
  flags.DEFINE_bool("verify", False, "Compare with transformers' own GGUF load (needs torch).")
  cli.run(main)
