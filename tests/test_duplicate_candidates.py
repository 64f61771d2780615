"""Candidates with the same tokens are one computation: an sCMMLU question whose four options are the same text
builds with a word in its report, scores the same bits for all four, and counts as three ties (issue 38)."""

import numpy as np
import jax
from transformers import AutoTokenizer

from s2sjax.data import metrics, task_registry
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import init_params
from s2sjax.data.packing import RowShape, fit
from s2sjax.scoring.scorer import Scorer, collect
from s2sjax.data.spec import load_spec
from tasks.build import QuestionEncoder, build_rows
from tasks.release import Question

SAME = "一百度。"


def _question(qid, options):
  return Question(id=qid, language="zh", uttids=(qid,) * 4, prefixes=("水的沸点是",) * 4, audio_paths=("",) * 4,
                  candidates=tuple(options), correct=0)


def test_identical_options_are_laid_once_reported_and_tie_exactly(qwen_tokenizer_dir):
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  encoder = QuestionEncoder(load_spec("qwen2.5"), "t2t", tokenizer, None)
  questions = [_question("same", [SAME] * 4), _question("distinct", [SAME, "十度。", "零度。", "五度。"]),
               _question("two_alike", [SAME, "十度。", SAME, "五度。"])]
  built = build_rows(questions, encoder, RowShape.for_length(256))
  rows, table, report = built
  assert report["questions_with_duplicate_candidates"] == ["same", "two_alike"]
  laid = (rows["slot_item"] >= 0).sum()
  assert laid == 1 + 4 + 3  # each distinct candidate of each question laid once

  config = ModelConfig(family="qwen2", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rotary_dim=8, rope_interleaved=False,
                       rms_norm_eps=1e-6, qkv_bias=True, o_bias=False, mlp_bias=False, tie_embeddings=True)
  params = init_params(config, jax.random.PRNGKey(0))
  rows, shape = fit(rows, built.shape, report["longest_item"])
  nll_sum, n_tokens = Scorer(config, shape, batch_size=1).score(params, rows, progress=False)
  candidates = collect(rows, nll_sum, n_tokens, table.candidates_per_item())
  scores = table.scores(candidates.nll_sum, candidates.n_tokens)

  same, distinct, two_alike = scores.nll_sum
  assert len(set(same.tolist())) == 1  # the same bits, not four sums that differ in the 6th digit
  assert two_alike[0] == two_alike[2] and two_alike[0] != two_alike[1]
  assert len(set(distinct.tolist())) == 4
  result = metrics.task_metrics(task_registry.get("scmmlu"), scores)
  assert result["ties"] == 3 + 1  # the all-same question's three comparisons, and two_alike's answer vs option C
