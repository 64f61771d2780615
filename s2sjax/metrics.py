"""Benchmark metrics from per-candidate losses: S2SBench's own arithmetic first, then the usual extras.

S2SBench (eval_story.py, eval_cmmlu4.py): a candidate's loss is its mean token cross-entropy.
  * stories: uttid 2k (right ending) against 2k+1 (wrong); right iff loss(2k) < loss(2k+1), strictly;
  * sCMMLU: the answer against each of the 3 distractors; right iff loss(answer) <= loss(distractor); the accuracy
    is over 3N comparisons, not a 4-way choice.
Extras: 4-way argmin accuracy, lm-eval-style `acc` (summed log-prob) and `acc_norm` (per byte of the candidate
text), the mean negative - positive loss gap, 95% bootstrap intervals, and the paired degradation report (T->T vs
S->T): a paired bootstrap interval and an exact McNemar test, both over questions (sCMMLU's three comparisons of a
question are not independent: McNemar counts a question right when its answer beats all three distractors).
"""

from __future__ import annotations

import numpy as np
import scipy.stats

BOOTSTRAP_SAMPLES = 1000


def question_arrays(questions: list[dict], nll_sum: np.ndarray, n_tokens: np.ndarray) -> dict[str, np.ndarray]:
  """Per question [N, candidates]: summed NLL, token counts, mean NLL; and the right candidate's index [N]."""
  sums = np.array([[nll_sum[i, j] for i, j in q["slots"]] for q in questions], np.float64)
  counts = np.array([[n_tokens[i, j] for i, j in q["slots"]] for q in questions], np.int64)
  if (counts <= 0).any():
    raise ValueError("a candidate has no scored tokens")
  return {"nll_sum": sums, "n_tokens": counts, "loss": sums / counts,
          "correct": np.array([q["correct"] for q in questions]),
          "bytes": np.array([[len(c.encode("utf-8")) for c in q["candidates"]] for q in questions], np.float64)}


def s2sbench_decisions(kind: str, loss: np.ndarray, correct: np.ndarray) -> np.ndarray:
  """The reference's right/wrong decisions: [N] for stories, [N * 3] (answer vs each distractor) for sCMMLU."""
  rows = np.arange(len(loss))
  right = loss[rows, correct]
  if kind == "story":
    if loss.shape[1] != 2:
      raise ValueError("stories have exactly two candidates")
    return right < loss[rows, 1 - correct]
  others = np.ones_like(loss, bool)
  others[rows, correct] = False
  return (right[:, None] <= loss)[others]


def _argmin_accuracy(values: np.ndarray, correct: np.ndarray) -> np.ndarray:
  return np.argmin(values, axis=1) == correct


def bootstrap_interval(decisions: np.ndarray, groups: int, seed: int = 0) -> tuple[float, float]:
  """95% percentile interval of the mean, resampling questions (a question's comparisons stay together)."""
  per_question = decisions.reshape(groups, -1).mean(axis=1)
  rng = np.random.default_rng(seed)
  means = per_question[rng.integers(0, groups, (BOOTSTRAP_SAMPLES, groups))].mean(axis=1)
  low, high = np.percentile(means, [2.5, 97.5])
  return float(low), float(high)


def task_metrics(kind: str, arrays: dict[str, np.ndarray]) -> dict:
  loss, correct = arrays["loss"], arrays["correct"]
  n = len(loss)
  rows = np.arange(n)
  decisions = s2sbench_decisions(kind, loss, correct)
  positive = loss[rows, correct]
  negative_mask = np.ones_like(loss, bool)
  negative_mask[rows, correct] = False
  negative = loss[negative_mask].reshape(n, -1)
  low, high = bootstrap_interval(decisions.astype(np.float64), n)
  metrics = {
    "questions": n,
    "comparisons": int(decisions.size),
    "accuracy": float(decisions.mean()),  # S2SBench's number
    "accuracy_ci95": [low, high],
    "positive_loss": float(positive.mean()),
    "negative_loss": float(negative.mean()),
    "positive_ppl": float(np.exp(positive.mean())),
    "negative_ppl": float(np.exp(negative.mean())),
    "loss_gap": float((negative.mean(axis=1) - positive).mean()),
    "acc": float(_argmin_accuracy(arrays["nll_sum"], correct).mean()),  # lm-eval: summed log-prob
    "acc_norm": float(_argmin_accuracy(arrays["nll_sum"] / arrays["bytes"], correct).mean()),
  }
  if loss.shape[1] > 2:
    metrics["argmin_accuracy"] = float(_argmin_accuracy(loss, correct).mean())
  return metrics


def mcnemar_p(first: np.ndarray, second: np.ndarray) -> tuple[int, int, float]:
  """Exact two-sided McNemar test on paired decisions: (first-only right, second-only right, p-value)."""
  b = int((first & ~second).sum())
  c = int((~first & second).sum())
  if b + c == 0:
    return b, c, 1.0
  return b, c, min(1.0, 2 * float(scipy.stats.binom.cdf(min(b, c), b + c, 0.5)))


def question_decisions(kind: str, loss: np.ndarray, correct: np.ndarray) -> np.ndarray:
  """[N] one decision per question: the story's, or for sCMMLU whether the answer beats all three distractors."""
  return s2sbench_decisions(kind, loss, correct).reshape(len(loss), -1).all(axis=1)


def degradation(kind: str, text: dict[str, np.ndarray], speech: dict[str, np.ndarray]) -> dict:
  """T->T against S->T on the same questions: accuracies, difference (with a paired bootstrap interval over
  questions), ratio, and McNemar on per-question decisions."""
  t = s2sbench_decisions(kind, text["loss"], text["correct"])
  s = s2sbench_decisions(kind, speech["loss"], speech["correct"])
  if t.shape != s.shape:
    raise ValueError("the text and speech runs hold different questions")
  questions = len(text["loss"])
  b, c, p = mcnemar_p(question_decisions(kind, text["loss"], text["correct"]),
                      question_decisions(kind, speech["loss"], speech["correct"]))
  return {
    "text_accuracy": float(t.mean()), "speech_accuracy": float(s.mean()),
    "degradation": float(t.mean() - s.mean()),
    "degradation_ci95": list(bootstrap_interval(t.astype(np.float64) - s.astype(np.float64), questions)),
    "ratio": float(s.mean() / t.mean()) if t.mean() else None,
    "mcnemar": {"questions": questions, "text_only_right": b, "speech_only_right": c, "p_value": p},
  }
