"""The Flax decoder computes what the PyTorch checkpoint computes (fp32 within 1e-4, long inputs)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from checkpoints_conversion.convert import convert
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model.attention import packed_attention_mask
from s2sjax.model.decoder import Decoder, sequence_log_probs
from tests.hf_models import save_hf, tiny_model, torch_log_probs

LENGTH = 600  # rope errors hide on short inputs


def _converted(tmp_path, model, **kwargs):
  convert(save_hf(model, str(tmp_path / "hf")), str(tmp_path / "ckpt"), **kwargs)
  return checkpoint.load_config(tmp_path / "ckpt"), checkpoint.load_params(tmp_path / "ckpt")


@pytest.mark.parametrize("family,tied", [("qwen2", False), ("qwen2", True), ("llama", False), ("glm", False)])
def test_fp32_log_probs_match_transformers(tmp_path, family, tied):
  model = tiny_model(family, tied=tied)
  config, params = _converted(tmp_path, model)
  assert config.tie_embeddings == tied
  ids = np.random.default_rng(1).integers(0, config.vocab_size, size=(2, LENGTH))
  reference = torch_log_probs(model, ids)
  ours = np.asarray(sequence_log_probs(config, params, ids))
  assert np.abs(ours - reference).max() <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "glm"])
def test_bf16_stays_close_to_fp32_reference(tmp_path, family, record_property):
  model = tiny_model(family)
  config, params = _converted(tmp_path, model, dtype="bfloat16")
  assert params["layers"]["mlp"]["up"]["kernel"].dtype == jnp.bfloat16
  ids = np.random.default_rng(2).integers(0, config.vocab_size, size=(1, LENGTH))
  reference = torch_log_probs(model, ids)
  ours = np.asarray(sequence_log_probs(config, params, ids, dtype=jnp.bfloat16))
  kl = float(np.mean(np.sum(np.exp(reference) * (reference - ours), axis=-1)))
  record_property("bf16_mean_kl", kl)
  print(f"{family} bf16 mean KL(torch fp32 || s2sjax bf16) = {kl:.2e}")
  assert 0 <= kl < 5e-4


@pytest.mark.slow
def test_packed_segments_equal_separate_sequences(tmp_path):
  """Two sequences in one row (segment ids, positions restarting) give each one's own log-probs."""
  model = tiny_model("qwen2")
  config, params = _converted(tmp_path, model)
  rng = np.random.default_rng(3)
  first, second = rng.integers(0, config.vocab_size, 70), rng.integers(0, config.vocab_size, 50)
  tokens = np.concatenate([first, second, np.zeros(8, int)])[None]
  segments = np.array([[1] * 70 + [2] * 50 + [0] * 8])
  positions = np.array([list(range(70)) + list(range(50)) + [0] * 8])
  decoder = Decoder(config)
  hidden = decoder.apply({"params": params}, tokens, positions, packed_attention_mask(jnp.asarray(segments)))
  packed = np.asarray(jax.nn.log_softmax(decoder.apply({"params": params}, hidden, method=Decoder.logits), -1))
  np.testing.assert_allclose(packed[0, :70], torch_log_probs(model, first[None])[0], atol=1e-4)
  np.testing.assert_allclose(packed[0, 70:120], torch_log_probs(model, second[None])[0], atol=1e-4)


def test_params_restore_onto_a_model_parallel_mesh(tmp_path):
  """The same checkpoint on 8 devices split 2 (data) x 4 (model) gives the same numbers as one device."""
  from s2sjax.runtime import sharding

  model = tiny_model("llama")
  convert(save_hf(model, str(tmp_path / "hf")), str(tmp_path / "ckpt"))
  config = checkpoint.load_config(tmp_path / "ckpt")
  mesh = sharding.make_mesh("data:2,model:4")
  params = checkpoint.load_params(tmp_path / "ckpt", mesh=mesh)
  q_kernel = params["layers"]["attn"]["q"]["kernel"]
  assert q_kernel.sharding.spec[2] == "model" and len(q_kernel.sharding.device_set) == 8
  ids = np.random.default_rng(4).integers(0, config.vocab_size, size=(2, 300))
  np.testing.assert_allclose(np.asarray(sequence_log_probs(config, params, ids)), torch_log_probs(model, ids), atol=1e-4)
