"""Shared test set-up: 8 host CPU devices for sharding tests, and fp32 everywhere unless a test asks."""

import os

# Must precede the first `import jax` of the session.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def torch():
  return pytest.importorskip("torch")
