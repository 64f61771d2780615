"""`python -m s2sjax.logprobs`: the log-softmax at every position of a converted checkpoint, against transformers'
own model; audio codes laid at the placeholders in their order; inputs that do not fit refused by name. (The
upstream oracles hold it to Baichuan-Audio and ChatGLM in test_upstream_oracles.py, Moshi in test_moshi.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from checkpoints_conversion.convert import convert
from s2sjax.scoring.architectures import decoder as decoder_architecture
from s2sjax.model.config import ModelConfig
from s2sjax.scoring.sequence_inputs import LogProbsError
from tests.hf_models import save_hf, tiny_model, torch_log_probs

PLACEHOLDER = 30


def _tables_config(**overrides) -> ModelConfig:
  """A tiny decoder with two codebook tables summed at PLACEHOLDER (Baichuan-Audio's way)."""
  fields = dict(family="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                num_kv_heads=1, head_dim=8, rope_theta=1e4, rotary_dim=8, rope_interleaved=False, rms_norm_eps=1e-6,
                qkv_bias=True, o_bias=False, mlp_bias=False, tie_embeddings=False, audio_codebook_sizes=(5, 3),
                audio_placeholder_id=PLACEHOLDER)
  return ModelConfig(**{**fields, **overrides})


def test_codes_are_laid_at_the_placeholders_in_their_order():
  ids = np.array([1, PLACEHOLDER, 7, PLACEHOLDER, PLACEHOLDER, 2])
  codes = np.array([[4, 0], [1, 2], [0, 1]])
  aligned = decoder_architecture.placeholder_codes(_tables_config(), ids, codes)
  np.testing.assert_array_equal(aligned, [[-1, -1], [4, 0], [-1, -1], [1, 2], [0, 1], [-1, -1]])
  assert decoder_architecture.placeholder_codes(_tables_config(), np.array([1, 2]), None) is None  # text alone


def test_inputs_that_do_not_fit_are_named():
  config = _tables_config()
  ids = np.array([1, PLACEHOLDER, PLACEHOLDER, 2])
  cases = [
    (ids, None, r"2 audio placeholder\(s\) \(id 30\): pass their codes as --audio_codes"),
    (ids, np.zeros((3, 2), int), r"audio_codes must be \[2, 2\] .* got \(3, 2\)"),
    (ids, np.zeros((2, 3), int), r"audio_codes must be \[2, 2\] .* got \(2, 3\)"),
    (ids, np.array([[0, 0], [0, 3]]), r"audio_codes\[:, 1\]\[1\] = 3 is outside table 1's rows \(0..2\)"),
    (np.array([1, 64]), None, r"input_ids\[1\] = 64 is outside the embedding's rows \(0..63\)"),
    (np.zeros((2, 3), int), None, r"one sequence of integer ids, \[T\] or \[1, T\]"),
  ]
  for input_ids, codes, named in cases:
    with pytest.raises(LogProbsError, match=named):
      decoder_architecture.decoder_inputs(config, input_ids, codes)
  text_only = _tables_config(audio_codebook_sizes=(), audio_placeholder_id=None)
  with pytest.raises(LogProbsError, match="no codebook tables"):
    decoder_architecture.decoder_inputs(text_only, ids, np.zeros((2, 2), int))
  with pytest.raises(LogProbsError, match="--features is for models that read a float feature track beside their ids "
                                          r"\(Kimi-Audio's Whisper features\); a qwen2 decoder reads none"):
    decoder_architecture.log_probs(text_only, None, ids[:1], features=np.zeros((2, 4), np.float32))


@pytest.mark.slow
def test_command_writes_transformers_log_softmax_at_every_position(tmp_path):
  """The one subprocess test: a tiny Qwen2 converted, its [T, vocab] written by the command, held to
  `log_softmax(Qwen2ForCausalLM(ids).logits)` within 1e-4."""
  model = tiny_model("qwen2")
  ckpt = str(tmp_path / "ckpt")
  convert(save_hf(model, str(tmp_path / "hf")), ckpt)
  ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(1, 200))
  np.save(tmp_path / "ids.npy", ids)
  out = tmp_path / "out.npy"
  command = [sys.executable, "-m", "s2sjax.logprobs", f"--checkpoint={ckpt}", f"--input_ids={tmp_path / 'ids.npy'}",
             f"--output={out}"]
  done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
  assert done.returncode == 0, done.stderr
  assert f"wrote {out}: log-probs (200, {model.config.vocab_size}) float32" in done.stdout
  ours = np.load(out)
  assert ours.dtype == np.float32
  assert np.abs(ours - torch_log_probs(model, ids)[0]).max() <= 1e-4
  refused = subprocess.run(command[:-1] + [f"--output={out}", f"--codebook_output={tmp_path / 'c.npy'}"],
                           capture_output=True, text=True, timeout=300, env=os.environ)
  assert refused.returncode == 1 and "error: --codebook_output is for checkpoints with an audio head" in refused.stderr
