"""The typed hand-offs between building, scoring and reporting.

`QuestionTable`: what a build laid down, question by question: each candidate's text and uttid, which one is
right, where each candidate sits in the packed items (`slots`), and the labels its release gave the question (a
sWUGGY pair's id, voice and frequency band: what a task's metrics group and break down by). The builder writes it into the data's
metadata; the evaluator reads it back.

`QuestionScores`: per question and candidate, summed NLL and token count (mean NLL = S2SBench's loss), with the
right candidate and the candidate texts. Metrics and result files take it; `scores.jsonl` is its file form
(`to_lines` / `from_lines`, exact), so an output directory's summaries are recomputed from its files. A line's
`is_answer` marks the question's right candidate (whatever the model made of it).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from s2sjax.runtime.output_dir import DamagedFileError

ANSWER_FIELD = "is_answer"  # a scores.jsonl line's mark of the right candidate


@dataclasses.dataclass(frozen=True)
class QuestionTable:
  ids: tuple[str, ...]  # [N] the question's id (its first uttid)
  uttids: tuple[tuple[str, ...], ...]  # [N][C] the release line of each candidate
  candidates: tuple[tuple[str, ...], ...]  # [N][C] candidate texts
  correct: np.ndarray  # [N] index of the right candidate
  slots: np.ndarray  # [N, C, 2] (packed item index, candidate index within the item)
  n_tokens: np.ndarray  # [N, C] tokens of each candidate
  prefixes: tuple[str, ...] = ()  # [N] the prefix text (`first`); empty for builds that did not record it
  labels: tuple[dict[str, str], ...] = ()  # [N] the release's labels of each question; empty: none given

  def __len__(self) -> int:
    return len(self.ids)

  @classmethod
  def from_records(cls, records: list[dict], where: str = "question table") -> "QuestionTable":
    """From the metadata's JSON form: a list of {id, uttids, candidates, correct, slots, n_tokens}."""
    widths = {len(r["candidates"]) for r in records}
    if len(widths) > 1:
      raise DamagedFileError(f"{where}: questions hold different numbers of candidates {sorted(widths)}")
    width = widths.pop() if widths else 0
    return cls(
      ids=tuple(str(r["id"]) for r in records),
      uttids=tuple(tuple(str(u) for u in r["uttids"]) for r in records),
      candidates=tuple(tuple(r["candidates"]) for r in records),
      correct=np.array([r["correct"] for r in records], np.int64),
      slots=np.array([r["slots"] for r in records], np.int64).reshape(len(records), width, 2),
      n_tokens=np.array([r["n_tokens"] for r in records], np.int64).reshape(len(records), width),
      prefixes=tuple(r.get("prefix", "") for r in records),
      labels=tuple(dict(r.get("labels", {})) for r in records) if any(r.get("labels") for r in records) else (),
    )

  def to_records(self) -> list[dict]:
    return [{"id": self.ids[q], "uttids": list(self.uttids[q]), "correct": int(self.correct[q]),
             "candidates": list(self.candidates[q]), "slots": self.slots[q].tolist(),
             "n_tokens": self.n_tokens[q].tolist(), "prefix": self.prefixes[q],
             **({"labels": self.labels[q]} if self.labels else {})} for q in range(len(self))]

  def candidates_per_item(self) -> list[int]:
    """How many candidates each packed item holds: what the rows must hold."""
    if not len(self):
      return []
    items, within = self.slots[..., 0].ravel(), self.slots[..., 1].ravel()
    counts = np.zeros(items.max() + 1, np.int64)
    np.maximum.at(counts, items, within + 1)  # candidates of the same tokens share one laying (tasks/build.py)
    return counts.tolist()

  def scores(self, nll_sum: np.ndarray, n_tokens: np.ndarray) -> "QuestionScores":
    """Per-question scores from per-(item, candidate) arrays [items, max candidates] (scoring.collect's)."""
    item, within = self.slots[..., 0], self.slots[..., 1]
    counts = np.asarray(n_tokens)[item, within].astype(np.int64)
    if (counts <= 0).any():
      q, c = np.argwhere(counts <= 0)[0]
      raise ValueError(f"question {self.ids[q]} candidate {c} has no scored tokens")
    return QuestionScores(self.ids, self.uttids, self.candidates, self.correct.copy(),
                          np.asarray(nll_sum, np.float64)[item, within], counts, self.labels)


@dataclasses.dataclass(frozen=True)
class QuestionScores:
  ids: tuple[str, ...]  # [N]
  uttids: tuple[tuple[str, ...], ...]  # [N][C]
  candidates: tuple[tuple[str, ...], ...]  # [N][C]
  correct: np.ndarray  # [N]
  nll_sum: np.ndarray  # [N, C] summed NLL over the candidate's tokens
  n_tokens: np.ndarray  # [N, C]
  labels: tuple[dict[str, str], ...] = ()  # [N] the release's labels of each question; empty: none given

  def __len__(self) -> int:
    return len(self.ids)

  @property
  def loss(self) -> np.ndarray:
    """S2SBench's loss: mean token cross-entropy of each candidate [N, C]."""
    return self.nll_sum / self.n_tokens

  @property
  def candidate_bytes(self) -> np.ndarray:
    """UTF-8 bytes of each candidate's text [N, C] (lm-eval's acc_norm divides by them)."""
    return np.array([[len(text.encode("utf-8")) for text in row] for row in self.candidates], np.float64)

  def select(self, ids: list[str]) -> "QuestionScores":
    """The questions `ids`, in that order."""
    index = {question: n for n, question in enumerate(self.ids)}
    pick = [index[i] for i in ids]
    return QuestionScores(tuple(ids), tuple(self.uttids[p] for p in pick), tuple(self.candidates[p] for p in pick),
                          self.correct[pick], self.nll_sum[pick], self.n_tokens[pick],
                          tuple(self.labels[p] for p in pick) if self.labels else ())

  def to_lines(self) -> list[dict]:
    """One JSON-ready line per candidate (scores.jsonl)."""
    lines = []
    loss = self.loss
    for q in range(len(self)):
      for c, text in enumerate(self.candidates[q]):
        lines.append({
          "question": self.ids[q], "uttid": self.uttids[q][c], "candidate": c, "text": text,
          ANSWER_FIELD: c == int(self.correct[q]), "nll_sum": float(self.nll_sum[q, c]),  # exact: summaries reread it
          "n_tokens": int(self.n_tokens[q, c]), "mean_nll": round(float(loss[q, c]), 6),
          "ppl": round(float(np.exp(loss[q, c])), 6), **({"labels": self.labels[q]} if self.labels else {}),
        })
    return lines

  @classmethod
  def from_lines(cls, lines: list[dict], where: str = "scores") -> "QuestionScores":
    """Back from `to_lines` (every question complete, one right candidate), exactly: summaries of an output
    directory are recomputed from its files."""
    by_question: dict[str, list[dict]] = {}
    for line in lines:
      by_question.setdefault(str(line["question"]), []).append(line)
    ids = tuple(by_question)
    rows = [sorted(by_question[q], key=lambda line: line["candidate"]) for q in ids]
    missing = [k for k in ("question", "uttid", "candidate", "text", ANSWER_FIELD, "nll_sum", "n_tokens")
               if any(k not in line for line in lines)]
    if missing:
      raise DamagedFileError(f"{where}: lines without {missing}: not a scores file of this version, or damaged")
    for q, row in zip(ids, rows):
      answers = sum(line[ANSWER_FIELD] for line in row)
      if [line["candidate"] for line in row] != list(range(len(row))) or answers != 1:
        raise DamagedFileError(f"{where}: question {q} does not hold candidates 0..{len(row) - 1} with one right one")
    widths = collections.Counter(len(row) for row in rows)
    if len(widths) > 1:
      usual = widths.most_common(1)[0][0]
      short = next(q for q, row in zip(ids, rows) if len(row) != usual)
      raise DamagedFileError(f"{where}: question {short} holds {len(by_question[short])} candidates, the others "
                             f"{usual} (lines lost or added: the file is damaged)")
    return cls(ids, tuple(tuple(line["uttid"] for line in row) for row in rows),
               tuple(tuple(line["text"] for line in row) for row in rows),
               np.array([[line[ANSWER_FIELD] for line in row].index(True) for row in rows], np.int64),
               np.array([[line["nll_sum"] for line in row] for row in rows], np.float64).reshape(len(rows), -1),
               np.array([[line["n_tokens"] for line in row] for row in rows], np.int64).reshape(len(rows), -1),
               tuple(dict(row[0].get("labels", {})) for row in rows) if any("labels" in line for line in lines) else ())
