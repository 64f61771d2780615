"""Every source layout users bring converts to the same parameters and the same numbers."""

import os

import numpy as np
import pytest
import torch

from checkpoints_conversion.convert import convert
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model.decoder import sequence_log_probs
from tests.hf_models import (
  baichuan_audio_checkpoint, baichuan_reference_log_probs, chatglm_checkpoint, save_hf, spoken_prefix, tiny_model,
  torch_log_probs)


def _load(path):
  return checkpoint.load_config(path), checkpoint.load_params(path)


def _assert_same_params(a, b):
  flat_a, flat_b = checkpoint.flatten(a), checkpoint.flatten(b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg="/".join(path))


@pytest.mark.slow
def test_chatglm_layout_equals_transformers_glm_layout(tmp_path):
  model = tiny_model("glm")
  convert(save_hf(model, str(tmp_path / "hf")), str(tmp_path / "from_hf"))
  convert(chatglm_checkpoint(model, str(tmp_path / "chatglm")), str(tmp_path / "from_chatglm"))
  (config_hf, params_hf), (config_glm, params_glm) = _load(tmp_path / "from_hf"), _load(tmp_path / "from_chatglm")
  assert config_hf == config_glm
  _assert_same_params(params_hf, params_glm)
  ids = np.random.default_rng(0).integers(0, config_glm.vocab_size, size=(1, 520))
  diff = np.abs(np.asarray(sequence_log_probs(config_glm, params_glm, ids)) - torch_log_probs(model, ids))
  assert diff.max() <= 1e-4


@pytest.mark.slow
def test_pytorch_bin_and_sharded_safetensors_equal_single_safetensors(tmp_path):
  model = tiny_model("qwen2")
  convert(save_hf(model, str(tmp_path / "single")), str(tmp_path / "a"))
  sharded = save_hf(model, str(tmp_path / "sharded"), max_shard_size="40KB")
  assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json"))
  convert(sharded, str(tmp_path / "b"))
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  model.config.to_json_file(str(bin_dir / "config.json"))
  torch.save(model.state_dict(), str(bin_dir / "pytorch_model.bin"))
  convert(str(bin_dir), str(tmp_path / "c"))
  reference = _load(tmp_path / "a")[1]
  _assert_same_params(reference, _load(tmp_path / "b")[1])
  _assert_same_params(reference, _load(tmp_path / "c")[1])


def test_codebook_tables_equal_transformers_fed_the_summed_embeddings(tmp_path):
  model = tiny_model("qwen2")
  sizes, placeholder = (16, 8, 8), 500
  source, tables, audio_head = baichuan_audio_checkpoint(model, str(tmp_path / "baichuan"), sizes, placeholder)
  manifest = convert(source, str(tmp_path / "ckpt"), family="baichuan_audio")
  assert manifest["kept_as_extras"] == ["audio_head.heads.0.weight"]
  extras = checkpoint.load_extras(tmp_path / "ckpt")
  np.testing.assert_array_equal(np.asarray(extras["audio_head"]["heads"]["0"]["weight"]), audio_head)
  config, params = _load(tmp_path / "ckpt")
  assert config.audio_codebook_sizes == (17, 9, 9) and config.audio_placeholder_id == placeholder

  rng = np.random.default_rng(6)
  length, audio = 530, slice(20, 420)  # a spoken prefix of 400 frames inside text
  tokens, codes = spoken_prefix(rng, length, audio, placeholder, sizes)

  reference = baichuan_reference_log_probs(model, tokens, codes, tables)
  ours = np.asarray(sequence_log_probs(config, params, tokens, codes))
  assert np.abs(ours - reference).max() <= 1e-4
