"""The workloads the benchmarks score (`s2sjax.bench` beside the PyTorch reference, `s2sjax.benchmarks.accelerator`
on one chip, the cost scripts beside them): the synthetic ones, the real StoryCloze stories, the s2sjax protocols
they lay them with and the rows they are packed in."""

from __future__ import annotations

import numpy as np

from s2sjax.data.packing import Item, RowShape, auto_row_length
from s2sjax.data.spec import load_spec
from s2sjax.runtime.errors import UserError
from s2sjax.scoring.checkpoints import checkpoint
from tasks.build import QuestionEncoder
from tasks.importer import read_stories
from tasks.release import Question


class BenchError(UserError, ValueError):
  """A benchmark's flags or inputs do not make a run: a size, protocol or attention it does not know, a missing
  data folder, a subject lm-eval lacks (`s2sjax.bench` raises it too)."""


WORKLOADS = {
  # prefix mean/std, candidates per item, candidate length range
  "stories": dict(prefix=(60, 8), options=2, candidate=(6, 18)),
  "speech": dict(prefix=(200, 20), options=4, candidate=(5, 15)),
}
# The s2sjax protocols: flag name -> (table name, share prefixes, item-local attention).
PROTOCOLS = {
  "noshare": ("s2sjax, no sharing", False, False),
  "shared": ("s2sjax, shared", True, False),
  "local": ("s2sjax, shared, item-local", True, True),
}


def make_items(workload: str, count: int, vocab: int, seed: int = 0) -> list[Item]:
  """`count` random items of a workload over a vocabulary of `vocab` ids (the same for a seed)."""
  spec = WORKLOADS[workload]
  rng = np.random.default_rng(seed)
  items = []
  for i in range(count):
    prefix_len = max(8, int(rng.normal(*spec["prefix"])))
    candidates = tuple(rng.integers(0, vocab, rng.integers(*spec["candidate"])) for _ in range(spec["options"]))
    items.append(Item(rng.integers(0, vocab, prefix_len), candidates, name=f"{workload}-{i}"))
  return items


def storycloze_items(csv_path: str, count: int, ckpt: str) -> list[Item]:
  """The first `count` StoryCloze stories as T->T items (the four sentences, then the right and wrong endings),
  tokenized by the checkpoint's tokenizer under the demo spec's rule (tasks.build.QuestionEncoder)."""
  tokenizer = checkpoint.load_tokenizer(ckpt)
  if tokenizer is None:
    raise BenchError(f"{ckpt} holds no tokenizer/ to tokenize the stories with")
  encoder = QuestionEncoder(load_spec("demo"), "t2t", tokenizer, None)
  items = []
  for story in read_stories(csv_path, ",")[:count]:
    first = " ".join(story["sentences"])
    question = Question(story["id"], "en", ("", ""), (first, first), ("", ""), (story["right"], story["wrong"]), 0)
    items.append(Item(encoder.prefix(question, 0)[0], tuple(encoder.candidate(question, c)[0] for c in range(2)),
                      name=story["id"]))
  return items


def row_shape(items: list[Item], row_length: int | None, share: bool) -> RowShape:
  """Rows of `row_length`, or, without one, of the length a build without `--row_length` chooses for these items
  (`packing.auto_row_length`, text candidates' share of the row's targets)."""
  if row_length:
    return RowShape.for_length(row_length)
  text_rows = RowShape.for_length(1024)
  return text_rows.with_length(auto_row_length(items, share, text_rows.max_targets / text_rows.length))
