"""Where the degradation is: the questions T->T gets right and S->T wrong (and the other way round; likewise for
each pair of s2sjax.data.modalities.COMPARISONS), for a person to read and listen to — the first thing to open after
the table.

    OUT/<checkpoint>/<task>.s2t_vs_t2t.flips.md     a table per direction, sorted by how far the margin moved
    OUT/<checkpoint>/<task>.s2t_vs_t2t.flips.html   the same, with an <audio> player per prefix

The page is self-contained: each flipped question's spoken prefix is embedded in it (a base64 `data:` URI, 4/3 of
the recording's size: 43 KB a second of 16 kHz 16-bit PCM, ~260 KB for a 6 s prefix), so it plays wherever the
page is copied. Past EMBED_BYTES of recordings (hundreds of flips of a whole release) the rest, the smallest moves,
link their files instead, and the page says how many.

A question's margin in a modality is the loss of its best wrong candidate minus the right one's (positive: the
model prefers the right candidate), so a question decided right has a positive margin under S2SBench's rule for
stories and a non-negative one for sCMMLU. The decisions are the task's own (metrics.question_decisions).

A release's texts and ids are data, not markup: the `.md` writes them through `markdown_text` (every character a
Markdown or HTML reader acts on in a table cell escaped, line breaks made spaces), the page through `html.escape`.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import mimetypes
import os
import re

import numpy as np
from etils import epath

from s2sjax.data import metrics, modalities, task_registry
from s2sjax.runtime.output_dir import write_atomic
from s2sjax.data.questions import QuestionScores


EMBED_BYTES = 32 * 2**20  # recordings embedded in one page at most: a page of ~43 MB
# What a Markdown or HTML reader acts on in a table cell: emphasis, code, links and images, strikethrough, math,
# tags and entities, the cell's border. An underscore between two letters or digits never opens or closes emphasis
# (CommonMark 6.2), so ids such as `16_zh` keep theirs bare.
MARKDOWN_SPECIAL = re.compile(r"[\\`*\[\]<>&~|$]|(?<![^\W_])_|_(?![^\W_])")


def markdown_text(text: str) -> str:
  """`text` as it reads, inside a Markdown table cell: each character with a meaning there backslash-escaped (any
  ASCII punctuation may be, CommonMark 2.4), line breaks as spaces."""
  return MARKDOWN_SPECIAL.sub(lambda m: "\\" + m.group(0), " ".join(text.splitlines()))


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


def _margins(loss: np.ndarray, scores: QuestionScores) -> np.ndarray:
  wrong = np.where(np.arange(loss.shape[1]) == scores.correct[:, None], np.inf, loss)
  return wrong.min(axis=1) - loss[np.arange(len(loss)), scores.correct]


def find_flips(record: task_registry.Task, reference: QuestionScores, other: QuestionScores) -> list[Flip]:
  """Questions (held by both, in the reference's order) whose decision differs between the modalities, largest
  margin change first."""
  in_other = set(other.ids)
  common = [i for i in reference.ids if i in in_other]
  reference, other = reference.select(common), other.select(common)
  reference_right = metrics.question_decisions(record, reference)
  other_right = metrics.question_decisions(record, other)
  reference_loss, other_loss = metrics.candidate_loss(record, reference), metrics.candidate_loss(record, other)
  reference_margin, other_margin = _margins(reference_loss, reference), _margins(other_loss, other)
  flips = [Flip(common[q], bool(reference_right[q]), float(reference_margin[q]), float(other_margin[q]),
                reference.candidates[q], int(reference.correct[q]), tuple(map(float, reference_loss[q])),
                tuple(map(float, other_loss[q])))
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
      text = markdown_text
      lines.append(f"| {text(f.question)} | {text(prefixes.get(f.question, ''))} | "
                   f"{'<br>'.join(text(c) for c in _candidate_lines(f, titles))} | {f.reference_margin:+.3f} | "
                   f"{f.other_margin:+.3f} | {text(audio.get(f.question, ''))} |")
    lines.append("")
  return "\n".join(lines)


def _uri(path: str) -> str:
  return path if "://" in path else "file://" + os.path.abspath(path)


def audio_sources(flips: list[Flip], audio: dict[str, str], embed_bytes: int = EMBED_BYTES) -> dict[str, str]:
  """Each flipped question's player source: its recording as a `data:` URI, largest move first, while the
  recordings embedded stay within `embed_bytes`; past that, or for a file that cannot be read, its file's URI."""
  sources, embedded, full = {}, 0, False
  for f in flips:
    path = audio.get(f.question)
    if path is None:
      continue
    data = None if full else _read(path)
    full = full or (data is not None and embedded + len(data) > embed_bytes)
    if data is None or full:
      sources[f.question] = _uri(path)
      continue
    embedded += len(data)
    # audio/wav whatever the system's table says (some say audio/x-wav)
    kind = "audio/wav" if path.lower().endswith(".wav") else mimetypes.guess_type(path)[0] or "audio/wav"
    sources[f.question] = f"data:{kind};base64,{base64.b64encode(data).decode('ascii')}"
  return sources


def _read(path: str) -> bytes | None:
  try:
    return epath.Path(path).read_bytes()
  except OSError:  # moved or deleted since the build: linked, and the page says so
    return None


def html_page(title: str, pair: tuple[str, str], flips: list[Flip], prefixes: dict[str, str],
              sources: dict[str, str]) -> str:
  """No scripts; the recordings are `sources` (`audio_sources`: embedded, or linked past its budget)."""
  titles = tuple(modalities.title(m) for m in pair)
  linked = sum(not src.startswith("data:") for src in sources.values())
  rows = []
  for heading, part in _sections(flips, titles):
    rows.append(f"<h2>{html.escape(heading)} ({len(part)})</h2><table><tr><th>question</th><th>prefix</th>"
                f"<th>candidates</th><th>margin {titles[0]}</th><th>margin {titles[1]}</th><th>audio</th></tr>")
    for f in part:
      player = (f'<audio controls preload="none" src="{html.escape(sources[f.question])}"></audio>'
                if f.question in sources else "")
      rows.append(f"<tr><td>{html.escape(f.question)}</td><td>{html.escape(prefixes.get(f.question, ''))}</td>"
                  f"<td>{'<br>'.join(html.escape(c) for c in _candidate_lines(f, titles))}</td>"
                  f"<td>{f.reference_margin:+.3f}</td><td>{f.other_margin:+.3f}</td><td>{player}</td></tr>")
    rows.append("</table>")
  style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
           "padding:4px 8px;vertical-align:top}")
  return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} flips</title>"
          f"<style>{style}</style></head><body><h1>{html.escape(title)}: where {titles[0]} and {titles[1]} "
          "disagree</h1>"
          f"<p>{len(flips)} questions decided differently.{_linked_note(linked)}</p>{''.join(rows)}</body></html>\n")


def _linked_note(linked: int) -> str:
  return (f" {linked} recordings (past {EMBED_BYTES // 2**20} MiB embedded, or unreadable) are linked as files, not "
          "embedded: they play only where those files are." if linked else "")


def write_flips(run_dir, task: str, title: str, pair: tuple[str, str], flips: list[Flip], prefixes: dict[str, str],
                audio: dict[str, str]) -> None:
  """`<task>.<other>_vs_<reference>.flips.md|html` for the pair (reference, other)."""
  stem = f"{task}.{modalities.comparison_key(*pair)}.flips"
  write_atomic(epath.Path(run_dir) / f"{stem}.md", markdown(title, pair, flips, prefixes, audio).encode("utf-8"))
  write_atomic(epath.Path(run_dir) / f"{stem}.html",
               html_page(title, pair, flips, prefixes, audio_sources(flips, audio)).encode("utf-8"))
