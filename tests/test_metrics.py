"""Metrics equal S2SBench's reference arithmetic (eval_story.py, eval_cmmlu4.py), ties included."""

import fractions
import math

import numpy as np
import pytest

from s2sjax.data import metrics
from s2sjax.data.questions import QuestionScores, QuestionTable


def _scores(questions: list[dict], nll_sum: np.ndarray, n_tokens: np.ndarray) -> QuestionScores:
  """Per-question scores through the question table's slots, as the evaluator makes them."""
  records = [dict(q, id=str(n), uttids=[f"{n}-{c}" for c in range(len(q["candidates"]))],
                  n_tokens=[1] * len(q["candidates"])) for n, q in enumerate(questions)]
  return QuestionTable.from_records(records).scores(nll_sum, n_tokens)


def _from_loss(loss: np.ndarray, correct: np.ndarray) -> QuestionScores:
  """Scores whose mean NLL is `loss` (one token per candidate)."""
  n, c = loss.shape
  return QuestionScores(tuple(map(str, range(n))), (("u",) * c,) * n, (("x",) * c,) * n, np.asarray(correct),
                        np.asarray(loss, float), np.ones((n, c), np.int64))


def reference_story_accuracy(lines: list[dict]) -> float:
  """eval_story.py: sort lines by the integer part of uttid, pair consecutive (2k, 2k+1), right iff strictly
  lower loss on the even (right-ending) line."""
  lines = sorted(lines, key=lambda l: int(str(l["uttid"]).split("_")[0]))
  right = 0
  for even, odd in zip(lines[0::2], lines[1::2]):
    assert int(str(odd["uttid"]).split("_")[0]) - int(str(even["uttid"]).split("_")[0]) == 1
    right += even["loss"] < odd["loss"]
  return right / (len(lines) // 2)


def reference_cmmlu_accuracy(lines: list[dict]) -> float:
  """eval_cmmlu4.py: per question, the answer's loss against each other key, right iff <=; over 3N."""
  right = total = 0
  for line in lines:
    for key in "ABCD":
      if key != line["answer"]:
        right += line["loss"][line["answer"]] <= line["loss"][key]
        total += 1
  return right / total


def _questions_from_story_lines(lines):
  by_key = {int(str(l["uttid"]).split("_")[0]): l for l in lines}
  questions, sums, counts = [], [], []
  for k in sorted(key for key in by_key if key % 2 == 0):
    even, odd = by_key[k], by_key[k + 1]
    i = len(questions)
    questions.append({"correct": 0, "slots": [[i, 0], [i, 1]], "candidates": ["a", "bb"]})
    sums.append(np.array([even["sum"], odd["sum"]]))
    counts.append(np.array([even["tokens"], odd["tokens"]]))
  return questions, np.array(sums), np.array(counts)


@pytest.mark.parametrize("seed", range(5))
def test_story_accuracy_equals_reference_on_random_score_files(seed):
  rng = np.random.default_rng(seed)
  lines = []
  for k in range(200):
    tokens = rng.integers(2, 5, 2)
    sums = rng.integers(4, 13, 2).astype(float)  # small integers: many exact ties (4/2 == 6/3)
    lines += [{"uttid": f"{2 * k}_s", "loss": sums[0] / tokens[0], "sum": sums[0], "tokens": tokens[0]},
              {"uttid": f"{2 * k + 1}_s", "loss": sums[1] / tokens[1], "sum": sums[1], "tokens": tokens[1]}]
  rng.shuffle(lines)
  questions, sums, counts = _questions_from_story_lines(lines)
  arrays = _scores(questions, sums, counts)
  assert (arrays.loss[:, 0] == arrays.loss[:, 1]).sum() >= 5  # ties are exercised
  assert metrics.task_metrics("pair", arrays)["accuracy"] == pytest.approx(reference_story_accuracy(lines))


@pytest.mark.parametrize("seed", range(5))
def test_cmmlu_accuracy_equals_reference_on_random_score_files(seed):
  rng = np.random.default_rng(seed)
  lines = [{"answer": "ABCD"[rng.integers(4)], "loss": dict(zip("ABCD", np.round(rng.uniform(1, 2, 4), 1)))}
           for _ in range(300)]
  questions = [{"correct": "ABCD".index(l["answer"]), "slots": [[i, j] for j in range(4)],
                "candidates": ["x", "y", "z", "w"]} for i, l in enumerate(lines)]
  sums = np.array([[l["loss"][k] for k in "ABCD"] for l in lines])
  arrays = _scores(questions, sums, np.ones_like(sums, dtype=np.int64))
  result = metrics.task_metrics("answer_vs_distractors", arrays)
  assert result["accuracy"] == pytest.approx(reference_cmmlu_accuracy(lines)) and result["comparisons"] == 900


def test_hand_built_cases_with_ties():
  # stories: a tie is wrong (strict); cmmlu: a tie is right (non-strict)
  story = _scores([{"correct": 0, "slots": [[0, 0], [0, 1]], "candidates": ["a", "b"]},
                                   {"correct": 0, "slots": [[1, 0], [1, 1]], "candidates": ["a", "b"]}],
                                  np.array([[2.0, 2.0], [1.0, 3.0]]), np.ones((2, 2), np.int64))
  assert metrics.task_metrics("pair", story)["accuracy"] == 0.5
  cmmlu = _scores([{"correct": 2, "slots": [[0, j] for j in range(4)], "candidates": list("abcd")}],
                                  np.array([[1.0, 2.0, 1.0, 0.5]]), np.ones((1, 4), np.int64))
  result = metrics.task_metrics("answer_vs_distractors", cmmlu)
  assert result["accuracy"] == pytest.approx(2 / 3)  # ties with A (right), beats B, loses to D
  assert result["argmin_accuracy"] == 0.0 and result["positive_loss"] == 1.0
  assert result["negative_loss"] == pytest.approx((1.0 + 2.0 + 0.5) / 3)
  assert result["loss_gap"] == pytest.approx((1.0 + 2.0 + 0.5) / 3 - 1.0)
  # SlamKit's rule (ties="half"): a tie counts half; the ties are counted under either rule
  assert metrics.task_metrics("pair", story, ties="half")["accuracy"] == 0.75
  assert metrics.task_metrics("pair", story)["ties"] == metrics.task_metrics("pair", story, ties="half")["ties"] == 1
  half = metrics.task_metrics("answer_vs_distractors", cmmlu, ties="half")
  assert half["accuracy"] == pytest.approx(1.5 / 3) and half["ties"] == 1
  with pytest.raises(ValueError, match="ties='both': choose one of reference, half"):
    metrics.task_metrics("pair", story, ties="both")


def test_acc_norm_divides_by_candidate_bytes():
  # summed NLL favours the short wrong candidate; per byte, the long right one wins
  arrays = _scores([{"correct": 0, "slots": [[0, 0], [0, 1]], "candidates": ["a long ending", "no"]}],
                                   np.array([[6.5, 2.0]]), np.array([[4, 1]]))
  result = metrics.task_metrics("pair", arrays)
  assert result["acc"] == 0.0 and result["acc_norm"] == 1.0


def test_mcnemar_exact_and_degradation():
  text = np.array([True] * 10 + [False] * 2)
  speech = np.array([True] * 3 + [False] * 7 + [True] * 2)
  b, c, p = metrics.mcnemar_p(text, speech)
  assert (b, c) == (7, 2) and p == pytest.approx(2 * sum(__import__("math").comb(9, k) for k in range(3)) / 2**9)
  assert metrics.mcnemar_p(text, text)[2] == 1.0
  arrays = lambda right: _from_loss(np.where(right[:, None], [[1.0, 2.0]], [[2.0, 1.0]]), np.zeros(12, int))
  report = metrics.degradation("pair", arrays(text), arrays(speech))
  assert report["degradation"] == pytest.approx(10 / 12 - 5 / 12) and report["ratio"] == pytest.approx(0.5)
  low, high = report["degradation_ci95"]
  assert low < report["degradation"] < high
  # 14,000 discordant pairs, balanced: the exact two-sided p is 1; then an unbalanced case by hand
  balanced = np.arange(14_000) % 2 == 0
  assert metrics.mcnemar_p(balanced, ~balanced)[2] == 1.0
  b, c, p = metrics.mcnemar_p(np.arange(15) < 9, np.arange(15) >= 9)
  assert (b, c) == (9, 6) and p == pytest.approx(2 * sum(math.comb(15, k) for k in range(7)) / 2**15)


@pytest.mark.parametrize("first_only, second_only", [(5_000, 6_582), (5_790, 5_792), (40, 11_542)])
def test_mcnemar_p_on_a_benchmarks_worth_of_flips_is_the_exact_binomial_tail(first_only, second_only):
  # as many discordant questions as CMMLU has questions; the reference sums the binomial in integers, exactly
  first = np.arange(first_only + second_only) < first_only
  n, k = first_only + second_only, min(first_only, second_only)
  term = total = 1
  for i in range(k):  # C(n, i + 1) from C(n, i)
    term = term * (n - i) // (i + 1)
    total += term
  exact = min(1, 2 * fractions.Fraction(total, 2**n))
  assert metrics.mcnemar_p(first, ~first) == (first_only, second_only, pytest.approx(float(exact), rel=1e-9))


def test_cmmlu_degradation_tests_questions_not_their_three_comparisons():
  # 12 questions; speech loses all three comparisons of 4 of them. Counted as 12 independent flips McNemar
  # would give p = 0.00049; over questions it is 4 flips: p = 2 / 2**4 = 0.125
  loss = np.tile([[0.0, 1.0, 1.0, 1.0]], (12, 1))
  flipped = loss.copy()
  flipped[:4, 0] = 2.0
  correct = np.zeros(12, int)
  report = metrics.degradation("answer_vs_distractors", _from_loss(loss, correct), _from_loss(flipped, correct))
  assert report["mcnemar"] == {"questions": 12, "reference_only_right": 4, "other_only_right": 0, "p_value": 0.125}
  assert report["degradation"] == pytest.approx(4 / 12)


def test_bootstrap_interval_brackets_the_accuracy():
  decisions = np.random.default_rng(0).random(400) < 0.7
  low, high = metrics.bootstrap_interval(decisions.astype(float), 400)
  assert low < decisions.mean() < high and 0.05 < high - low < 0.12
