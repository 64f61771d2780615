"""orbax -> Hugging Face -> orbax is bit-identical, and transformers runs the exported model."""

import numpy as np
import pytest
import torch

from checkpoints_conversion.convert import convert
from checkpoints_conversion.export_hf import export
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model.decoder import init_params, sequence_log_probs
from s2sjax.model.families import from_hf_config
from tests.hf_models import tiny_model, torch_log_probs


@pytest.mark.slow
@pytest.mark.parametrize("family,tied,dtype", [("qwen2", False, "float32"), ("llama", True, "bfloat16")])
def test_roundtrip_is_bit_identical_and_loads_in_transformers(tmp_path, family, tied, dtype):
  import jax
  import jax.numpy as jnp
  from transformers import AutoModelForCausalLM

  config = from_hf_config(tiny_model(family, tied=tied).config.to_dict())
  params = init_params(config, jax.random.PRNGKey(7), param_dtype=jnp.dtype(dtype))  # as if trained in JAX
  checkpoint.save_params(tmp_path / "trained", config, params)
  names = export(str(tmp_path / "trained"), str(tmp_path / "hf"), max_shard_bytes=60_000)
  assert len(names) > 1  # sharded, with an index
  convert(str(tmp_path / "hf"), str(tmp_path / "back"), dtype=dtype)
  back = checkpoint.load_params(tmp_path / "back")
  assert checkpoint.load_config(tmp_path / "back") == config
  for (path, a), (_, b) in zip(checkpoint.flatten(params), checkpoint.flatten(back)):
    assert a.dtype == b.dtype, path
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg="/".join(path))

  hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
  ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, 512))
  params32 = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  np.testing.assert_allclose(
    np.asarray(sequence_log_probs(config, params32, ids)), torch_log_probs(hf, ids), atol=1e-4)


@pytest.mark.slow
def test_what_transformers_cannot_hold_is_refused_not_dropped():
  import dataclasses

  import jax

  from checkpoints_conversion.export_hf import ExportError, hf_tensors

  glm = from_hf_config(tiny_model("glm").config.to_dict())
  with pytest.raises(ExportError, match=r"model family glm4 has no transformers architecture to export to"):
    hf_tensors(glm, init_params(glm, jax.random.PRNGKey(0)))
  qwen = from_hf_config(tiny_model("qwen2").config.to_dict())
  with_tables = dataclasses.replace(qwen, audio_codebook_sizes=(9, 9), audio_placeholder_id=3)
  with pytest.raises(ExportError, match=r"Qwen2ForCausalLM has no place for audio_embed_0/embedding, audio_embed_1"):
    hf_tensors(with_tables, init_params(with_tables, jax.random.PRNGKey(0)))


def test_a_random_source_of_a_published_shape_converts_back_to_that_shape(tmp_path, monkeypatch):
  import dataclasses

  from checkpoints_conversion import random_source
  from s2sjax.scoring import planner

  published = planner.named_models()["qwen2.5-0.5b"]  # its biases, tying, rope theta and head layout; fewer and narrower layers
  small = dataclasses.replace(published, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=16, rotary_dim=16, vocab_size=300)
  monkeypatch.setattr(planner, "named_models", lambda: {"small": small})
  convert(random_source.write("small", str(tmp_path / "hf")), str(tmp_path / "ckpt"))
  assert checkpoint.load_config(tmp_path / "ckpt") == small
  with pytest.raises(ValueError, match="unknown shape 'qwen2.5-3b'"):
    random_source.write("qwen2.5-3b", str(tmp_path / "other"))
