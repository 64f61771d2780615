"""Scoring through a model's own forward (s2sjax/scoring/own_forward.py): the built rows laid again one candidate a segment,
held equal to the shared-prefix path on the project's decoder on all four modalities of the bundled sample, and a
Flax model of the test's own, which reads segment ids only, scored through it."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s2sjax.scoring.evaluator import Evaluator, ScoringOptions
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import init_params
from s2sjax.scoring.own_forward import OwnForward, decoder_forward, unshared_rows
from s2sjax.data.task_data import load_task_data

MODALITIES = ("t2t", "s2t", "t2s", "s2s")
CONFIG = ModelConfig(family="llama", vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, rope_theta=10000.0, rotary_dim=8, rope_interleaved=False,
                     rms_norm_eps=1e-5, qkv_bias=False, o_bias=False, mlp_bias=False, tie_embeddings=False)


@pytest.fixture(scope="module")
def data(bytes_sample):
  return [load_task_data(bytes_sample["data_dir"], "sstorycloze", m, bytes_sample["spec"], None) for m in MODALITIES]


def test_every_candidate_is_laid_in_a_segment_of_its_own_behind_its_own_prefix(data):
  rows = data[0].rows
  laid, origin = unshared_rows(rows, data[0].shape)
  assert len(origin) == int((rows["slot_item"] >= 0).sum())
  for r in range(len(laid["segment_ids"])):
    for segment in set(laid["segment_ids"][r][laid["segment_ids"][r] > 0]):
      where = laid["segment_ids"][r] == segment
      assert len(set(laid["branch_ids"][r][where])) == 2  # its prefix and one candidate: no tree
      np.testing.assert_array_equal(laid["positions"][r][where], np.arange(where.sum()))  # restarting per segment
  # each slot scores the same target tokens as the shared row's slot it stands for
  for item, (r, slot) in enumerate(origin):
    row, new_slot = np.argwhere(laid["slot_item"] == item)[0]
    np.testing.assert_array_equal(laid["target_ids"][row][laid["target_slot"][row] == new_slot],
                                  rows["target_ids"][r][rows["target_slot"][r] == slot])


@pytest.mark.slow
def test_the_decoders_own_forward_scores_as_the_shared_prefix_path_on_all_four_modalities(data):
  params = init_params(CONFIG, jax.random.PRNGKey(0))
  shared = Evaluator(CONFIG, data, ScoringOptions(batch_size=2))
  own = Evaluator(decoder_forward(CONFIG), data, ScoringOptions(batch_size=2))
  for td in data:
    a, b = shared.score(params, td), own.score(params, td)
    np.testing.assert_array_equal(a.n_tokens, b.n_tokens)
    np.testing.assert_allclose(b.loss, a.loss, atol=1e-5, rtol=0)
  assert own.compiled_count() == len({td.shape.length for td in data})  # one step per row length


class SegmentLM(nn.Module):
  """A model of its own: no positions (a causal convolution of its embeddings), attention masked by segment ids."""

  vocab: int = 256
  width: int = 16

  @nn.compact
  def __call__(self, tokens, segment_ids):
    x = nn.Embed(self.vocab, self.width)(tokens)
    previous = jnp.pad(x, ((0, 0), (1, 0), (0, 0)))[:, :-1] * (segment_ids == jnp.pad(
      segment_ids, ((0, 0), (1, 0)))[:, :-1])[..., None]
    x = x + nn.Dense(self.width)(previous)
    length = tokens.shape[1]
    mask = (segment_ids[:, :, None] == segment_ids[:, None, :]) & jnp.tril(jnp.ones((length, length), bool))
    x = x + nn.SelfAttention(num_heads=2, precision=jax.lax.Precision.HIGHEST)(x, mask=mask[:, None])
    return nn.Dense(self.vocab, precision=jax.lax.Precision.HIGHEST)(x)


@pytest.mark.slow
def test_a_flax_model_of_its_own_is_scored_through_its_forward(data):
  model = SegmentLM()
  params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
  forward = OwnForward(lambda p, tokens, positions, segments: model.apply(p, tokens, segments), 256, "SegmentLM")
  td = data[1]  # spoken prefixes, text candidates
  scores = Evaluator(forward, [td], ScoringOptions(batch_size=2)).score(params, td)
  rows = td.rows
  where = {tuple(pair): (q, c) for q, pairs in enumerate(td.questions.slots) for c, pair in enumerate(pairs)}
  cases = []  # (question, candidate, prefix, candidate's tokens) of 8 slots
  for r, slot in list(zip(*np.nonzero(rows["slot_item"] >= 0)))[:8]:
    targets = rows["target_slot"][r] == slot
    segment = rows["segment_ids"][r, rows["target_pos"][r][targets][0]]
    prefix = rows["tokens"][r][(rows["segment_ids"][r] == segment) & (rows["branch_ids"][r] == 0)]
    cases.append((*where[(rows["slot_item"][r, slot], rows["slot_candidate"][r, slot])], prefix,
                  rows["target_ids"][r][targets]))
  # each prefix + candidate alone, one sequence a line of one call (one compilation): the padding after it, in a
  # segment of its own, is out of reach of the causal model's earlier positions
  length = max(len(prefix) + len(candidate) for _, _, prefix, candidate in cases)
  sequences, segments = np.zeros((len(cases), length), np.int32), np.zeros((len(cases), length), np.int32)
  for i, (_, _, prefix, candidate) in enumerate(cases):
    sequences[i, :len(prefix) + len(candidate)] = np.concatenate([prefix, candidate])
    segments[i, :len(prefix) + len(candidate)] = 1
  log_probs = np.asarray(jax.nn.log_softmax(model.apply(params, jnp.asarray(sequences), jnp.asarray(segments)), -1))
  for i, (q, c, prefix, candidate) in enumerate(cases):
    alone = -float(log_probs[i, np.arange(len(prefix) - 1, len(prefix) + len(candidate) - 1), candidate].sum())
    assert scores.nll_sum[q, c] == pytest.approx(alone, abs=1e-5 * len(candidate))
