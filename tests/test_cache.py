"""Every command line compiles into XLA's persistent cache under $S2SJAX_CACHE, unless one is set already."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = "import jax; from s2sjax.runtime import cache; cache.use_compilation_cache(); print(jax.config.jax_compilation_cache_dir)"


def _probe(env: dict) -> str:
  base = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  return subprocess.run([sys.executable, "-c", PROBE], env=dict(base, **env), cwd=ROOT, capture_output=True,
                        text=True, check=True).stdout.strip()


def test_the_compilation_cache_lives_in_the_project_cache_unless_one_is_set(tmp_path):
  assert _probe({"S2SJAX_CACHE": str(tmp_path)}) == os.path.join(str(tmp_path), "xla")
  assert _probe({"S2SJAX_CACHE": str(tmp_path), "JAX_COMPILATION_CACHE_DIR": "/elsewhere"}) == "/elsewhere"
