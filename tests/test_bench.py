"""The benchmark's three protocols score the same numbers and count the tokens they compute correctly."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402

from checkpoints_conversion.convert import convert  # noqa: E402
from s2sjax import bench  # noqa: E402
from tests.hf_models import save_hf, tiny_model  # noqa: E402


def test_protocols_agree_and_sharing_computes_fewer_tokens(tmp_path):
  convert(save_hf(tiny_model("llama"), str(tmp_path / "hf")), str(tmp_path / "ckpt"))
  run = bench.run_workload("speech", str(tmp_path / "ckpt"), count=6, row_length=512, batch_size=1,
                           ref_batch_size=4, dtype=jnp.float32)
  results = run["results"]
  items = bench.make_items("speech", 6, 512)
  lengths = [len(it.prefix) + len(c) for it in items for c in it.candidates]
  assert results["reference"]["computed"] == sum(4 * max(lengths[i : i + 4]) for i in range(0, len(lengths), 4))
  for name in ("s2sjax, no sharing", "s2sjax, shared"):
    np.testing.assert_allclose(results[name]["mean_nll"], results["reference"]["mean_nll"], atol=1e-4)
  assert results["s2sjax, shared"]["computed"] < results["s2sjax, no sharing"]["computed"]
  assert "| s2sjax, shared |" in bench.format_table(run)
