"""Benchmark metrics from per-candidate losses: S2SBench's own arithmetic first, then the usual extras.

S2SBench (eval_story.py, eval_cmmlu4.py): a candidate's loss is its mean token cross-entropy. A task's decision
rule (its registry record's `decision`, a `Decision` of the `DECISIONS` registry) turns losses into comparisons:
  * pair (stories): uttid 2k (right ending) against 2k+1 (wrong); right iff loss(2k) < loss(2k+1), strictly;
  * answer_vs_distractors (sCMMLU): the answer against each of the 3 distractors; right iff loss(answer) <=
    loss(distractor); the accuracy is over 3N comparisons, not a 4-way choice.
A tie (equal losses) is what the rule's comparison makes it (wrong for stories, right for sCMMLU's <=); with
ties="half" it counts half, as SlamKit's modelling metric (slamkit/metric/modelling_metric.py) and so TWIST's and
Moshi's spoken StoryCloze numbers count it. The number of tied comparisons is reported either way.
Extras: 4-way argmin accuracy, lm-eval-style `acc` (summed log-prob) and `acc_norm` (per byte of the candidate
text), the mean negative - positive loss gap, 95% bootstrap intervals, and the paired degradation report of one
modality against another (S->T against T->T, and the rest of s2sjax.data.modalities.COMPARISONS): a paired bootstrap
interval and an exact McNemar test, both over questions (sCMMLU's three comparisons of a question are not
independent: McNemar counts a question right when its answer beats all three distractors). `summarize` makes all of
it for every task and modality scored: what metrics.json holds.
A task's record can say more, for the spoken-LM benchmarks' own arithmetic (ZeroSpeech's sLM21 and ProsAudit, SALMon):
its candidates' loss is their summed NLL (`loss="sum"`), its questions are averaged within groups first
(`averaged_over`, a question label: a pair's voices) and the accuracy is the mean over groups, and metrics.json
breaks the accuracy down by labels (`breakdowns`: frequency bands, types).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from s2sjax.data import task_registry, modalities
from s2sjax.data.questions import QuestionScores
from s2sjax.runtime.registry import Registry

BOOTSTRAP_SAMPLES = 1000
TIE_RULES = ("reference", "half")  # a tie as the decision rule's comparison makes it, or half right


def _others(loss: np.ndarray, correct: np.ndarray) -> np.ndarray:
  """[N, C-1] losses of the wrong candidates, in candidate order."""
  mask = np.ones_like(loss, bool)
  mask[np.arange(len(loss)), correct] = False
  return loss[mask].reshape(len(loss), -1)


def _pair(loss: np.ndarray, correct: np.ndarray) -> np.ndarray:
  if loss.shape[1] != 2:
    raise ValueError(f"the pair decision needs exactly two candidates, got {loss.shape[1]}")
  return loss[np.arange(len(loss)), correct][:, None] < _others(loss, correct)


def _answer_vs_distractors(loss: np.ndarray, correct: np.ndarray) -> np.ndarray:
  return loss[np.arange(len(loss)), correct][:, None] <= _others(loss, correct)


@dataclasses.dataclass(frozen=True)
class Decision:
  """A decision rule: (loss [N, C], right candidate [N]) -> comparisons [N, k], True = the model was right."""

  name: str
  rule: Callable[[np.ndarray, np.ndarray], np.ndarray]
  summary: str


# A plugin's task that decides another way registers its rule here, as a task registers in s2sjax.data.task_registry.
DECISIONS: Registry[Decision] = Registry("decision rule")
DECISIONS.register(Decision("pair", _pair, "the right candidate's loss strictly below the wrong one's"))
DECISIONS.register(Decision("answer_vs_distractors", _answer_vs_distractors,
                            "the answer's loss at most each distractor's, one comparison each"))


def comparisons(decision: str, loss: np.ndarray, correct: np.ndarray) -> np.ndarray:
  """[N, k] the reference's right/wrong comparisons of each question (k = 1 for stories, 3 for sCMMLU)."""
  return DECISIONS.get(decision).rule(loss, correct)


def tied(loss: np.ndarray, correct: np.ndarray) -> np.ndarray:
  """[N, k] whether each comparison's right candidate and its rival have exactly equal losses."""
  return loss[np.arange(len(loss)), correct][:, None] == _others(loss, correct)


def s2sbench_decisions(decision: str, loss: np.ndarray, correct: np.ndarray, ties: str = "reference") -> np.ndarray:
  """The decisions, flat: [N] for stories, [N * 3] (answer vs each distractor) for sCMMLU; 1 right, 0 wrong, and
  with ties="half" 0.5 for a tie."""
  if ties not in TIE_RULES:
    raise ValueError(f"ties={ties!r}: choose one of {', '.join(TIE_RULES)}")
  decided = comparisons(decision, loss, correct).astype(np.float64)
  if ties == "half":
    decided = np.where(tied(loss, correct), 0.5, decided)
  return decided.ravel()


def _argmin_accuracy(values: np.ndarray, correct: np.ndarray) -> np.ndarray:
  return np.argmin(values, axis=1) == correct


def bootstrap_interval(decisions: np.ndarray, groups: int, seed: int = 0) -> tuple[float, float]:
  """95% percentile interval of the mean, resampling questions (a question's comparisons stay together)."""
  per_question = decisions.reshape(groups, -1).mean(axis=1)
  rng = np.random.default_rng(seed)
  means = per_question[rng.integers(0, groups, (BOOTSTRAP_SAMPLES, groups))].mean(axis=1)
  low, high = np.percentile(means, [2.5, 97.5])
  return float(low), float(high)


def candidate_loss(record: task_registry.Task, scores: QuestionScores) -> np.ndarray:
  """[N, C] each candidate's loss as the task forms it (its record's `loss`): the mean token NLL (S2SBench's) or the
  summed NLL (minus the recording's log-probability)."""
  return scores.loss if record.loss == "mean" else scores.nll_sum


def _units(record: task_registry.Task, scores: QuestionScores) -> list[list[int]]:
  """The questions averaged together (the record's `averaged_over` label's groups, in the order first seen), or
  each question alone."""
  if record.averaged_over is None:
    return [[q] for q in range(len(scores))]
  groups: dict[str, list[int]] = {}
  for q in range(len(scores)):
    groups.setdefault(_label(record, scores, q, record.averaged_over), []).append(q)
  return list(groups.values())


def _label(record: task_registry.Task, scores: QuestionScores, q: int, name: str) -> str:
  labels = scores.labels[q] if scores.labels else {}
  if name not in labels:
    raise ValueError(f"task {record.name} groups or breaks down by the label {name!r}, which question {scores.ids[q]} "
                     f"does not carry (its labels: {labels})")
  return labels[name]


def unit_scores(decisions: np.ndarray, units: list[list[int]]) -> np.ndarray:
  """[units] the mean of each unit's questions' decisions (a question's own k comparisons weigh equally)."""
  per_question = decisions.reshape(sum(map(len, units)), -1).mean(axis=1)
  return np.array([per_question[members].mean() for members in units])


def _breakdown(record: task_registry.Task, scores: QuestionScores, units: list[list[int]], values: np.ndarray,
               name: str) -> dict:
  """{label value: n, accuracy, std} over the units, each unit under its first question's value (as zrc's
  `groupby(...).apply(x.iat[0, ...])` labels a pair by its first voice's line); std as pandas' (ddof 1), None for
  one unit."""
  by_value: dict[str, list[float]] = {}
  for members, value in zip(units, values):
    by_value.setdefault(_label(record, scores, members[0], name), []).append(float(value))
  return {value: {"n": len(v), "accuracy": float(np.mean(v)),
                  "std": float(np.std(v, ddof=1)) if len(v) > 1 else None} for value, v in by_value.items()}


def task_metrics(record: task_registry.Task, scores: QuestionScores, ties: str | None = None) -> dict:
  """A task's metrics on its scores: the accuracy by its decision rule and tie rule (`ties` overrides the record's),
  over its candidates' loss (`candidate_loss`), averaged over its record's groups, broken down by its labels."""
  ties = ties or record.ties
  loss, correct = candidate_loss(record, scores), scores.correct
  n = len(loss)
  if not np.isfinite(loss).all():  # NaN compares false both ways: every metric would be quietly wrong
    q, c = np.argwhere(~np.isfinite(loss))[0]
    raise ValueError(f"{int((~np.isfinite(loss)).sum())} candidates have a non-finite loss (first: question "
                     f"{scores.ids[q]} candidate {c}): no metric is computed from them")
  decisions = s2sbench_decisions(record.decision, loss, correct, ties)
  units = _units(record, scores)
  values = unit_scores(decisions, units)
  positive = loss[np.arange(n), correct]
  negative = _others(loss, correct)
  low, high = bootstrap_interval(values, len(units))
  metrics = {
    "questions": n,
    "comparisons": int(decisions.size),
    "accuracy": float(values.mean()),  # S2SBench's number (the mean over comparisons when nothing is averaged)
    "accuracy_ci95": [low, high],
    "ties": int(tied(loss, correct).sum()),
    "tie_rule": ties,
    "positive_loss": float(positive.mean()),
    "negative_loss": float(negative.mean()),
    "positive_ppl": float(np.exp(positive.mean())),
    "negative_ppl": float(np.exp(negative.mean())),
    "loss_gap": float((negative.mean(axis=1) - positive).mean()),
    "acc": float(_argmin_accuracy(scores.nll_sum, correct).mean()),  # lm-eval: summed log-prob
    "acc_norm": float(_argmin_accuracy(scores.nll_sum / scores.candidate_bytes, correct).mean()),
  }
  if loss.shape[1] > 2:
    metrics["argmin_accuracy"] = float(_argmin_accuracy(loss, correct).mean())
  if record.averaged_over is not None:
    metrics["averaged_over"] = {"label": record.averaged_over, "groups": len(units)}
  for name in record.breakdowns:
    metrics[f"by_{name}"] = _breakdown(record, scores, units, values, name)
  return metrics


def mcnemar_p(first: np.ndarray, second: np.ndarray) -> tuple[int, int, float]:
  """Exact two-sided McNemar test on paired decisions: (first-only right, second-only right, p-value)."""
  b = int((first & ~second).sum())
  c = int((~first & second).sum())
  if b + c == 0:
    return b, c, 1.0
  return b, c, min(1.0, 2 * _binomial_half_cdf(min(b, c), b + c))


def _binomial_half_cdf(k: int, n: int) -> float:
  """P(X <= k) for X ~ Binomial(n, 1/2), k <= n / 2: the largest term C(n, k) / 2^n from log-gamma, times the sum of
  the terms below it relative to it, summed until they fall under the float's resolution (about 4.4 sqrt(n) terms
  when k is near n / 2: under 500 for CMMLU's 11,582 questions). No scipy: importing it costs a command ~1 s."""
  log_top = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2)
  term = total = 1.0
  for i in range(k, 0, -1):  # C(n, i-1) / C(n, i) = i / (n - i + 1)
    term *= i / (n - i + 1)
    total += term
    if term < 1e-17 * total:
      break
  return math.exp(log_top) * total


def question_decisions(record: task_registry.Task, scores: QuestionScores) -> np.ndarray:
  """[N] one decision per question: the story's, or for sCMMLU whether the answer beats all three distractors."""
  return comparisons(record.decision, candidate_loss(record, scores), scores.correct).all(axis=1)


def degradation(record: task_registry.Task, reference: QuestionScores, other: QuestionScores,
                ties: str | None = None) -> dict:
  """A modality against a reference one (S->T against T->T) on the same questions: accuracies, the drop (with a
  paired bootstrap interval over the task's units: questions, or its groups), ratio, and McNemar on per-question
  decisions."""
  if reference.ids != other.ids:
    raise ValueError("the two modalities' runs hold different questions")
  ties = ties or record.ties
  units = _units(record, reference)
  r, o = (unit_scores(s2sbench_decisions(record.decision, candidate_loss(record, s), s.correct, ties), units)
          for s in (reference, other))
  b, c, p = mcnemar_p(question_decisions(record, reference), question_decisions(record, other))
  return {
    "reference_accuracy": float(r.mean()), "accuracy": float(o.mean()),
    "degradation": float(r.mean() - o.mean()),
    "degradation_ci95": list(bootstrap_interval(r - o, len(units))),
    "ratio": float(o.mean() / r.mean()) if r.mean() else None,
    "mcnemar": {"questions": len(reference), "reference_only_right": b, "other_only_right": c, "p_value": p},
  }


def summarize(scores: dict[tuple[str, str], QuestionScores], ties: str | None = None) -> dict:
  """Metrics of every (task, modality), and the degradation matrix of every task: each pair of
  s2sjax.data.modalities.COMPARISONS that ran, over the questions both hold (--skip_bad may leave out different ones).
  `ties` (TIE_RULES) overrides each task's own rule for ties."""
  result: dict = {}
  for (task, modality), s in scores.items():
    result.setdefault(task, {})[modality] = task_metrics(task_registry.get(task), s, ties)
  for task in dict.fromkeys(task for task, _ in scores):
    for reference, other in modalities.COMPARISONS:
      if (task, reference) in scores and (task, other) in scores:
        first, second = common_questions(scores[(task, reference)], scores[(task, other)])
        result.setdefault("degradation", {}).setdefault(task, {})[modalities.comparison_key(reference, other)] = (
          degradation(task_registry.get(task), first, second, ties))
  return result


def common_questions(first: QuestionScores, second: QuestionScores) -> tuple[QuestionScores, QuestionScores]:
  """Both on the questions both hold, in the first's order."""
  in_second = set(second.ids)
  common = [i for i in first.ids if i in in_second]
  return first.select(common), second.select(common)
