"""Per-candidate details: the further numbers an architecture's scoring step gives beside each candidate's NLL
(`Architecture.details`: MiMo-Audio's NLL per RVQ channel, Step-Audio 2's NLL over its audio ids alone), question by
question, as `QuestionScores` holds the NLLs, and their file form (`<task>-<modality>.details.jsonl`: `to_lines`, one
line per question x candidate). Each is a sum over the candidate's scored tokens, as `nll_sum` is, in float64.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from s2sjax.data.questions import QuestionTable


@dataclasses.dataclass(frozen=True)
class QuestionDetails:
  names: tuple[str, ...]  # [D] what each number is (the architecture's names)
  ids: tuple[str, ...]  # [N] the question's id
  uttids: tuple[tuple[str, ...], ...]  # [N][C] the release line of each candidate
  values: np.ndarray  # [N, C, D]

  @classmethod
  def of(cls, table: QuestionTable, names: tuple[str, ...], per_item: np.ndarray) -> "QuestionDetails":
    """From per-(item, candidate) details [items, max candidates, D] (scoring.collect's), as `QuestionTable.scores`
    places the NLLs."""
    item, within = table.slots[..., 0], table.slots[..., 1]
    return cls(tuple(names), table.ids, table.uttids, np.asarray(per_item, np.float64)[item, within])

  def to_lines(self) -> list[dict]:
    """One JSON-ready line per question x candidate, in the scores file's order."""
    return [{"question": self.ids[q], "candidate": c, "uttid": uttid,
             **{name: float(self.values[q, c, d]) for d, name in enumerate(self.names)}}
            for q in range(len(self.ids)) for c, uttid in enumerate(self.uttids[q])]
