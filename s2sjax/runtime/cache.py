"""The project's cache on this machine (`$S2SJAX_CACHE`, default `~/.cache/s2sjax`): the converted default model,
the default data, the smoke run's data, the identities of the tokenizer folders read (`text_tokenizer.folder_identity`),
and XLA's persistent compilation cache (with XLA's autotuning and kernel caches), which every command line turns
on (`use_compilation_cache`): a step compiled by an earlier run is loaded instead of compiled again (the main job's
5.8 s of compiling become 1.4 s on a 2-core CPU, `python -m s2sjax.examples.compilation_cache`)."""

from __future__ import annotations

import os
import sys


ENV = "S2SJAX_CACHE"


def cache_dir() -> str:
  return os.environ.get(ENV, os.path.join(os.path.expanduser("~"), ".cache", "s2sjax"))


_asked = []  # [True] once a command line asked for the cache


def use_compilation_cache() -> None:
  """XLA's persistent compilation cache in `cache_dir()`/xla, unless one is set (JAX_COMPILATION_CACHE_DIR or
  jax's config); it serves the compilations after it, so it comes first. A command that has not imported jax yet
  gets it when the module that loads jax late (the audio tokenizers' runner) calls `when_jax_loads`."""
  _asked[:] = [True]
  jax = sys.modules.get("jax")
  if jax is None:
    return
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", os.path.join(cache_dir(), "xla"))
  # Every program is kept, however fast it compiled (JAX keeps only those over a second by default): an audio
  # tokenizer's compile a second run must not repeat (`tasks.audio.tokenize`, `tasks.prepare`) may be quick on a
  # CPU; and XLA's own caches beside it (GPU autotuning results, compiled kernels), where JAX has them.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  if hasattr(jax.config, "jax_persistent_cache_enable_xla_caches"):
    jax.config.update("jax_persistent_cache_enable_xla_caches", "all")


def when_jax_loads() -> None:
  """The compilation cache a command line asked for before jax was imported (`use_compilation_cache`); nothing
  where none asked (a library call keeps its caller's settings)."""
  if _asked:
    use_compilation_cache()
