"""Per-pair results in SlamKit's terms, for tasks whose questions are a positive and a negative recording compared
whole (a release format with `pair_items`: SpokenStoryCloze and SlamKit's other StoryCloze layouts, SALMon's parts,
and any pair task of whole recordings registered so).

SlamKit prints one number per run, the mean over pairs (slp-rl/slamkit 388b402, slamkit/metric/modelling_metric.py:
98-99, cli/eval.py:77-86), and writes nothing per pair; what it computes per pair is this file's line:

    OUT/<checkpoint>/<task>-<modality>.pairs.jsonl
    {"sample": 0, "question": "0", "positive": "0_99e0.wav", "negative": "1_99e0.wav",
     "positive_log_likelihood": -3.1, "negative_log_likelihood": -3.4,
     "positive_tokens": 121, "negative_tokens": 118, "result": 1.0}

`sample` is the pair's index in the task's order, `positive` / `negative` the recordings SlamKit's dataset gives as
`pos_file` / `neg_file` (the question's right and wrong candidate: `<uttid>.wav`), each `*_log_likelihood` what
`model.log_likelihood` returns for it (slamkit/model/unit_lm.py:184-194 with calc_nll, slamkit/utils/
calculation_utils.py:5-29: minus the candidate's NLL, its mean over the scored tokens with `mean_nll` and its sum
without, as the task's `loss` forms it), and `result` SlamKit's `res`: 1 when the positive is the likelier, 0.5 on
an exact tie, else 0 (modelling_metric.py:91-94). The mean of `result` is the number SlamKit prints. A question's
labels (its folder, a speaker's) come along as `labels`, as in scores.jsonl.
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.questions import QuestionScores

PAIRS_SUFFIX = ".pairs.jsonl"


def pair_lines(scores: QuestionScores, losses: np.ndarray) -> list[dict]:
  """One line per question of two candidates; `losses` [N, 2] each candidate's loss as the task forms it (its mean
  or summed NLL), so that minus it is SlamKit's log-likelihood."""
  if scores.nll_sum.shape[1:] != (2,):
    raise ValueError(f"pair lines compare two candidates per question, not {scores.nll_sum.shape[1]}")
  lines = []
  for q, question in enumerate(scores.ids):
    right = int(scores.correct[q])
    wrong = 1 - right
    positive, negative = -float(losses[q, right]), -float(losses[q, wrong])
    lines.append({
      "sample": q, "question": question,
      "positive": f"{scores.uttids[q][right]}.wav", "negative": f"{scores.uttids[q][wrong]}.wav",
      "positive_log_likelihood": positive, "negative_log_likelihood": negative,
      "positive_tokens": int(scores.n_tokens[q, right]), "negative_tokens": int(scores.n_tokens[q, wrong]),
      "result": 1.0 if positive > negative else 0.5 if positive == negative else 0.0,
      **({"labels": scores.labels[q]} if scores.labels else {}),
    })
  return lines


def slamkit_accuracy(lines: list[dict]) -> float:
  """The number SlamKit prints for these pairs: the mean of their results."""
  return float(np.mean([line["result"] for line in lines]))
