"""Metrics equal S2SBench's reference arithmetic (eval_story.py, eval_cmmlu4.py), ties included."""

import dataclasses
import fractions
import math

import numpy as np
import pytest

from s2sjax.data import metrics, task_registry
from s2sjax.data.questions import QuestionScores, QuestionTable

STORIES, CMMLU = task_registry.get("sstorycloze"), task_registry.get("scmmlu")  # the two decision rules


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
  assert metrics.task_metrics(STORIES, arrays)["accuracy"] == pytest.approx(reference_story_accuracy(lines))


@pytest.mark.parametrize("seed", range(5))
def test_cmmlu_accuracy_equals_reference_on_random_score_files(seed):
  rng = np.random.default_rng(seed)
  lines = [{"answer": "ABCD"[rng.integers(4)], "loss": dict(zip("ABCD", np.round(rng.uniform(1, 2, 4), 1)))}
           for _ in range(300)]
  questions = [{"correct": "ABCD".index(l["answer"]), "slots": [[i, j] for j in range(4)],
                "candidates": ["x", "y", "z", "w"]} for i, l in enumerate(lines)]
  sums = np.array([[l["loss"][k] for k in "ABCD"] for l in lines])
  arrays = _scores(questions, sums, np.ones_like(sums, dtype=np.int64))
  result = metrics.task_metrics(CMMLU, arrays)
  assert result["accuracy"] == pytest.approx(reference_cmmlu_accuracy(lines)) and result["comparisons"] == 900


def test_hand_built_cases_with_ties():
  # stories: a tie is wrong (strict); cmmlu: a tie is right (non-strict)
  story = _scores([{"correct": 0, "slots": [[0, 0], [0, 1]], "candidates": ["a", "b"]},
                                   {"correct": 0, "slots": [[1, 0], [1, 1]], "candidates": ["a", "b"]}],
                                  np.array([[2.0, 2.0], [1.0, 3.0]]), np.ones((2, 2), np.int64))
  assert metrics.task_metrics(STORIES, story)["accuracy"] == 0.5
  cmmlu = _scores([{"correct": 2, "slots": [[0, j] for j in range(4)], "candidates": list("abcd")}],
                                  np.array([[1.0, 2.0, 1.0, 0.5]]), np.ones((1, 4), np.int64))
  result = metrics.task_metrics(CMMLU, cmmlu)
  assert result["accuracy"] == pytest.approx(2 / 3)  # ties with A (right), beats B, loses to D
  assert result["argmin_accuracy"] == 0.0 and result["positive_loss"] == 1.0
  assert result["negative_loss"] == pytest.approx((1.0 + 2.0 + 0.5) / 3)
  assert result["loss_gap"] == pytest.approx((1.0 + 2.0 + 0.5) / 3 - 1.0)
  # SlamKit's rule (ties="half"): a tie counts half; the ties are counted under either rule
  assert metrics.task_metrics(STORIES, story, ties="half")["accuracy"] == 0.75
  assert metrics.task_metrics(STORIES, story)["ties"] == metrics.task_metrics(STORIES, story, ties="half")["ties"] == 1
  half = metrics.task_metrics(CMMLU, cmmlu, ties="half")
  assert half["accuracy"] == pytest.approx(1.5 / 3) and half["ties"] == 1
  with pytest.raises(ValueError, match="ties='both': choose one of reference, half"):
    metrics.task_metrics(STORIES, story, ties="both")


def test_acc_norm_divides_by_candidate_bytes():
  # summed NLL favours the short wrong candidate; per byte, the long right one wins
  arrays = _scores([{"correct": 0, "slots": [[0, 0], [0, 1]], "candidates": ["a long ending", "no"]}],
                                   np.array([[6.5, 2.0]]), np.array([[4, 1]]))
  result = metrics.task_metrics(STORIES, arrays)
  assert result["acc"] == 0.0 and result["acc_norm"] == 1.0


def test_mcnemar_exact_and_degradation():
  text = np.array([True] * 10 + [False] * 2)
  speech = np.array([True] * 3 + [False] * 7 + [True] * 2)
  b, c, p = metrics.mcnemar_p(text, speech)
  assert (b, c) == (7, 2) and p == pytest.approx(2 * sum(__import__("math").comb(9, k) for k in range(3)) / 2**9)
  assert metrics.mcnemar_p(text, text)[2] == 1.0
  arrays = lambda right: _from_loss(np.where(right[:, None], [[1.0, 2.0]], [[2.0, 1.0]]), np.zeros(12, int))
  report = metrics.degradation(STORIES, arrays(text), arrays(speech))
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
  report = metrics.degradation(CMMLU, _from_loss(loss, correct), _from_loss(flipped, correct))
  assert report["mcnemar"] == {"questions": 12, "reference_only_right": 4, "other_only_right": 0, "p_value": 0.125}
  assert report["degradation"] == pytest.approx(4 / 12)


def test_bootstrap_interval_brackets_the_accuracy():
  decisions = np.random.default_rng(0).random(400) < 0.7
  low, high = metrics.bootstrap_interval(decisions.astype(float), 400)
  assert low < decisions.mean() < high and 0.05 < high - low < 0.12


def test_a_task_averaged_over_a_label_scores_groups_as_zerospeech_does():
  """sWUGGY's arithmetic (zerospeech-benchmarks 0.9.4 tasks/lm/lexical.py:80-91, submissions/sLM21.py:348-358): a
  pair right 1, tied 0.5, wrong 0 on summed log-probs; an id's score the mean over its voices; the overall the mean
  over ids; a band's the mean over its ids; the in-vocabulary figure the ids outside the oov band. Worked by hand
  here on five ids, two voices each."""
  record = dataclasses.replace(STORIES, name="toy_lexical", loss="sum", averaged_over="id", ties="half",
                               breakdowns=("frequency_band", "in_vocabulary"))
  # (id, band, summed NLL of the word, of the non-word) per voice; token counts differ so mean and sum disagree
  pairs = [("a", "oov", (3.0, 4.0), (5.0, 5.0)), ("b", "1-5", (2.0, 1.0), (2.0, 6.0)), ("c", "1-5", (1.0, 2.0), (1.0, 2.0)),
           ("d", ">100", (7.0, 6.0), (9.0, 8.0)), ("e", "oov", (1.0, 9.0), (4.0, 3.0))]
  ids, nll, tokens, labels = [], [], [], []
  for pair, band, *voices in pairs:
    for voice, (word, non_word) in zip(("v1", "v2"), voices):
      ids.append(f"{pair}_{voice}")
      nll.append((word, non_word))
      tokens.append((1, 10))  # the non-word's mean NLL is always lower: a mean loss would say 0 for every pair
      labels.append({"id": pair, "voice": voice, "frequency_band": band,
                     "in_vocabulary": "no" if band == "oov" else "yes"})
  n = len(ids)
  scores = QuestionScores(tuple(ids), (("w", "nw"),) * n, (("w", "nw"),) * n, np.zeros(n, np.int64),
                          np.array(nll), np.array(tokens), tuple(labels))
  m = metrics.task_metrics(record, scores)
  # per id: a (1 + 0.5) / 2, b (0 + 1) / 2, c 1, d (0 + 0) / 2, e (1 + 0) / 2
  per_id = {"a": 0.75, "b": 0.5, "c": 1.0, "d": 0.0, "e": 0.5}
  assert m["accuracy"] == pytest.approx(np.mean(list(per_id.values())))
  assert m["averaged_over"] == {"label": "id", "groups": 5} and m["questions"] == 10 and m["ties"] == 1
  assert m["by_frequency_band"] == {
    "oov": {"n": 2, "accuracy": pytest.approx(0.625), "std": pytest.approx(np.std([0.75, 0.5], ddof=1))},
    "1-5": {"n": 2, "accuracy": pytest.approx(0.75), "std": pytest.approx(np.std([0.5, 1.0], ddof=1))},
    ">100": {"n": 1, "accuracy": 0.0, "std": None}}
  assert m["by_in_vocabulary"]["yes"]["accuracy"] == pytest.approx(np.mean([0.5, 1.0, 0.0]))  # n-weighted bands
  assert metrics.task_metrics(dataclasses.replace(record, loss="mean"), scores)["accuracy"] == 0.0


def test_labels_travel_from_the_table_to_the_scores_file_and_back():
  table = QuestionTable.from_records([
    {"id": "a", "uttids": ["w", "nw"], "correct": 0, "candidates": ["w", "nw"], "slots": [[0, 0], [0, 1]],
     "n_tokens": [2, 3], "labels": {"id": "a", "voice": "v1"}}])
  assert QuestionTable.from_records(table.to_records()).labels == ({"id": "a", "voice": "v1"},)
  scores = table.scores(np.array([[1.0, 2.0]]), np.array([[2, 3]]))
  lines = scores.to_lines()
  assert [line["labels"] for line in lines] == [{"id": "a", "voice": "v1"}] * 2
  assert QuestionScores.from_lines(lines).labels == scores.labels
  unlabelled = QuestionTable.from_records([{k: v for k, v in table.to_records()[0].items() if k != "labels"}])
  assert unlabelled.labels == () and "labels" not in unlabelled.scores(np.ones((1, 2)), np.ones((1, 2))).to_lines()[0]


def test_a_question_without_a_label_its_task_groups_by_is_named():
  record = dataclasses.replace(STORIES, name="toy_lexical", averaged_over="id")
  scores = QuestionScores(("q1",), (("w", "nw"),), (("w", "nw"),), np.zeros(1, np.int64), np.ones((1, 2)),
                          np.ones((1, 2), np.int64), ({"voice": "v1"},))
  with pytest.raises(ValueError, match="label 'id', which question q1 does not carry"):
    metrics.task_metrics(record, scores)
