"""Where the degradation is: the questions T->T gets right and S->T wrong (and the other way round; likewise for
each pair of s2sjax.modalities.COMPARISONS), for a person to read and listen to — the first thing to open after
the table.

    OUT/<checkpoint>/<task>.s2t_vs_t2t.flips.md     a table per direction, sorted by how far the margin moved
    OUT/<checkpoint>/<task>.s2t_vs_t2t.flips.html   the same, self-contained, with an <audio> player per prefix

A question's margin in a modality is the loss of its best wrong candidate minus the right one's (positive: the
model prefers the right candidate), so a question decided right has a positive margin under S2SBench's rule for
stories and a non-negative one for sCMMLU. The decisions are the task's own (metrics.question_decisions).
"""

from __future__ import annotations

import dataclasses
import html
import os

import numpy as np
from etils import epath

from s2sjax import metrics, modalities
from s2sjax.output_dir import write_atomic
from s2sjax.questions import QuestionScores


@dataclasses.dataclass(frozen=True)
class Flip:
  question: str
  reference_right: bool  # the reference modality (T->T) decided it right, and so the other (S->T) wrong
  reference_margin: float
  other_margin: float
  candidates: tuple[str, ...]
  correct: int
  reference_loss: tuple[float, ...]
  other_loss: tuple[float, ...]


def _margins(scores: QuestionScores) -> np.ndarray:
  loss = scores.loss
  wrong = np.where(np.arange(loss.shape[1]) == scores.correct[:, None], np.inf, loss)
  return wrong.min(axis=1) - loss[np.arange(len(loss)), scores.correct]


def find_flips(decision: str, reference: QuestionScores, other: QuestionScores) -> list[Flip]:
  """Questions (held by both, in the reference's order) whose decision differs between the modalities, largest
  margin change first."""
  in_other = set(other.ids)
  common = [i for i in reference.ids if i in in_other]
  reference, other = reference.select(common), other.select(common)
  reference_right = metrics.question_decisions(decision, reference.loss, reference.correct)
  other_right = metrics.question_decisions(decision, other.loss, other.correct)
  reference_margin, other_margin = _margins(reference), _margins(other)
  flips = [Flip(common[q], bool(reference_right[q]), float(reference_margin[q]), float(other_margin[q]),
                reference.candidates[q], int(reference.correct[q]), tuple(map(float, reference.loss[q])),
                tuple(map(float, other.loss[q])))
           for q in np.flatnonzero(reference_right != other_right)]
  return sorted(flips, key=lambda f: (-abs(f.reference_margin - f.other_margin), f.question))


def _sections(flips: list[Flip], titles: tuple[str, str]) -> list[tuple[str, list[Flip]]]:
  first, second = titles
  return [(f"{first} right, {second} wrong", [f for f in flips if f.reference_right]),
          (f"{second} right, {first} wrong", [f for f in flips if not f.reference_right])]


def _candidate_lines(flip: Flip, titles: tuple[str, str]) -> list[str]:
  return [f"{'✓' if c == flip.correct else '✗'} {text} ({titles[0]} {flip.reference_loss[c]:.3f}, {titles[1]} "
          f"{flip.other_loss[c]:.3f})" for c, text in enumerate(flip.candidates)]


def markdown(title: str, pair: tuple[str, str], flips: list[Flip], prefixes: dict[str, str],
             audio: dict[str, str]) -> str:
  titles = tuple(modalities.title(m) for m in pair)
  lines = [f"# {title}: where {titles[0]} and {titles[1]} disagree", "",
           f"{len(flips)} questions decided differently. Margin: best wrong loss − right loss (nats/token; > 0 "
           "prefers the right candidate). Candidates: ✓ right, ✗ wrong, with their mean NLL in both modalities.", ""]
  for heading, part in _sections(flips, titles):
    lines += [f"## {heading} ({len(part)})", "",
              f"| question | prefix | candidates | margin {titles[0]} | margin {titles[1]} | audio |",
              "|---|---|---|---|---|---|"]
    for f in part:
      cell = lambda text: text.replace("|", "\\|").replace("\n", " ")
      lines.append(f"| {f.question} | {cell(prefixes.get(f.question, ''))} | "
                   f"{'<br>'.join(cell(c) for c in _candidate_lines(f, titles))} | {f.reference_margin:+.3f} | "
                   f"{f.other_margin:+.3f} | {audio.get(f.question, '')} |")
    lines.append("")
  return "\n".join(lines)


def _uri(path: str) -> str:
  return path if "://" in path else "file://" + os.path.abspath(path)


def html_page(title: str, pair: tuple[str, str], flips: list[Flip], prefixes: dict[str, str],
              audio: dict[str, str]) -> str:
  """Self-contained (no scripts, no external files but the recordings it links)."""
  titles = tuple(modalities.title(m) for m in pair)
  rows = []
  for heading, part in _sections(flips, titles):
    rows.append(f"<h2>{html.escape(heading)} ({len(part)})</h2><table><tr><th>question</th><th>prefix</th>"
                f"<th>candidates</th><th>margin {titles[0]}</th><th>margin {titles[1]}</th><th>audio</th></tr>")
    for f in part:
      player = (f'<audio controls preload="none" src="{html.escape(_uri(audio[f.question]))}"></audio>'
                if f.question in audio else "")
      rows.append(f"<tr><td>{html.escape(f.question)}</td><td>{html.escape(prefixes.get(f.question, ''))}</td>"
                  f"<td>{'<br>'.join(html.escape(c) for c in _candidate_lines(f, titles))}</td>"
                  f"<td>{f.reference_margin:+.3f}</td><td>{f.other_margin:+.3f}</td><td>{player}</td></tr>")
    rows.append("</table>")
  style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
           "padding:4px 8px;vertical-align:top}")
  return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} flips</title>"
          f"<style>{style}</style></head><body><h1>{html.escape(title)}: where {titles[0]} and {titles[1]} "
          "disagree</h1>"
          f"<p>{len(flips)} questions decided differently.</p>{''.join(rows)}</body></html>\n")


def write_flips(run_dir, task: str, title: str, pair: tuple[str, str], flips: list[Flip], prefixes: dict[str, str],
                audio: dict[str, str]) -> None:
  """`<task>.<other>_vs_<reference>.flips.md|html` for the pair (reference, other)."""
  stem = f"{task}.{modalities.comparison_key(*pair)}.flips"
  write_atomic(epath.Path(run_dir) / f"{stem}.md", markdown(title, pair, flips, prefixes, audio).encode("utf-8"))
  write_atomic(epath.Path(run_dir) / f"{stem}.html", html_page(title, pair, flips, prefixes, audio).encode("utf-8"))
