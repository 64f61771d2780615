"""Where the degradation is: the questions T->T gets right and S->T wrong (and the other way round), for a person
to read and listen to — the first thing to open after the table.

    OUT/<checkpoint>/<task>.flips.md     a table per direction, sorted by how far the margin moved
    OUT/<checkpoint>/<task>.flips.html   the same, self-contained, with an <audio> player per spoken prefix

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

from s2sjax import metrics
from s2sjax.output_dir import write_atomic
from s2sjax.questions import QuestionScores


@dataclasses.dataclass(frozen=True)
class Flip:
  question: str
  text_right: bool  # T->T decided it right (and so S->T wrong)
  text_margin: float
  speech_margin: float
  candidates: tuple[str, ...]
  correct: int
  text_loss: tuple[float, ...]
  speech_loss: tuple[float, ...]


def _margins(scores: QuestionScores) -> np.ndarray:
  loss = scores.loss
  wrong = np.where(np.arange(loss.shape[1]) == scores.correct[:, None], np.inf, loss)
  return wrong.min(axis=1) - loss[np.arange(len(loss)), scores.correct]


def find_flips(decision: str, text: QuestionScores, speech: QuestionScores) -> list[Flip]:
  """Questions (held by both, in text's order) whose decision differs between the modalities, largest margin
  change first."""
  in_speech = set(speech.ids)
  common = [i for i in text.ids if i in in_speech]
  text, speech = text.select(common), speech.select(common)
  text_right = metrics.question_decisions(decision, text.loss, text.correct)
  speech_right = metrics.question_decisions(decision, speech.loss, speech.correct)
  text_margin, speech_margin = _margins(text), _margins(speech)
  flips = [Flip(common[q], bool(text_right[q]), float(text_margin[q]), float(speech_margin[q]), text.candidates[q],
                int(text.correct[q]), tuple(map(float, text.loss[q])), tuple(map(float, speech.loss[q])))
           for q in np.flatnonzero(text_right != speech_right)]
  return sorted(flips, key=lambda f: (-abs(f.text_margin - f.speech_margin), f.question))


def _sections(flips: list[Flip]) -> list[tuple[str, list[Flip]]]:
  return [("T→T right, S→T wrong", [f for f in flips if f.text_right]),
          ("S→T right, T→T wrong", [f for f in flips if not f.text_right])]


def _candidate_lines(flip: Flip) -> list[str]:
  return [f"{'✓' if c == flip.correct else '✗'} {text} (T→T {flip.text_loss[c]:.3f}, S→T {flip.speech_loss[c]:.3f})"
          for c, text in enumerate(flip.candidates)]


def markdown(title: str, flips: list[Flip], prefixes: dict[str, str], audio: dict[str, str]) -> str:
  lines = [f"# {title}: where T→T and S→T disagree", "",
           f"{len(flips)} questions decided differently. Margin: best wrong loss − right loss (nats/token; > 0 "
           "prefers the right candidate). Candidates: ✓ right, ✗ wrong, with their mean NLL in both modalities.", ""]
  for heading, part in _sections(flips):
    lines += [f"## {heading} ({len(part)})", "", "| question | prefix | candidates | margin T→T | margin S→T | audio |",
              "|---|---|---|---|---|---|"]
    for f in part:
      cell = lambda text: text.replace("|", "\\|").replace("\n", " ")
      lines.append(f"| {f.question} | {cell(prefixes.get(f.question, ''))} | "
                   f"{'<br>'.join(cell(c) for c in _candidate_lines(f))} | {f.text_margin:+.3f} | "
                   f"{f.speech_margin:+.3f} | {audio.get(f.question, '')} |")
    lines.append("")
  return "\n".join(lines)


def _uri(path: str) -> str:
  return path if "://" in path else "file://" + os.path.abspath(path)


def html_page(title: str, flips: list[Flip], prefixes: dict[str, str], audio: dict[str, str]) -> str:
  """Self-contained (no scripts, no external files but the recordings it links)."""
  rows = []
  for heading, part in _sections(flips):
    rows.append(f"<h2>{html.escape(heading)} ({len(part)})</h2><table><tr><th>question</th><th>prefix</th>"
                "<th>candidates</th><th>margin T→T</th><th>margin S→T</th><th>audio</th></tr>")
    for f in part:
      player = (f'<audio controls preload="none" src="{html.escape(_uri(audio[f.question]))}"></audio>'
                if f.question in audio else "")
      rows.append(f"<tr><td>{html.escape(f.question)}</td><td>{html.escape(prefixes.get(f.question, ''))}</td>"
                  f"<td>{'<br>'.join(html.escape(c) for c in _candidate_lines(f))}</td>"
                  f"<td>{f.text_margin:+.3f}</td><td>{f.speech_margin:+.3f}</td><td>{player}</td></tr>")
    rows.append("</table>")
  style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
           "padding:4px 8px;vertical-align:top}")
  return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} flips</title>"
          f"<style>{style}</style></head><body><h1>{html.escape(title)}: where T→T and S→T disagree</h1>"
          f"<p>{len(flips)} questions decided differently.</p>{''.join(rows)}</body></html>\n")


def write_flips(run_dir, task: str, title: str, flips: list[Flip], prefixes: dict[str, str],
                audio: dict[str, str]) -> None:
  write_atomic(epath.Path(run_dir) / f"{task}.flips.md", markdown(title, flips, prefixes, audio).encode("utf-8"))
  write_atomic(epath.Path(run_dir) / f"{task}.flips.html", html_page(title, flips, prefixes, audio).encode("utf-8"))
