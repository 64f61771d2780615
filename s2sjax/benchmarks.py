"""The task registry: one record per benchmark, read by everything that needs to know a task.

The release reader and the TFDS builder (`tasks`), the metrics (the decision rule), the result tables (titles),
the planner (sizes), the command lines (`--task` choices) and the sample maker all look a task up here; none of
them lists tasks. Adding a benchmark is one `register(Benchmark(...))` plus its builder file (see
docs/architecture.md, "Adding a task"); a module of your own that registers one is found through `S2SJAX_PLUGINS`
(s2sjax/plugins.py).
"""

from __future__ import annotations

import dataclasses

from s2sjax.registry import Registry

# How the release's jsonl lines become questions (tasks/release.py reads each format):
#   story_pairs:     `uttid, first, last`; uttid 2k holds the right ending, 2k+1 the wrong one of the same story
#   multiple_choice: `uttid, first, A, B, C, D, answer`; one prefix, four options
# story_pairs, multiple_choice: S2SBench's jsonl layouts; spoken_pairs: slp-rl/SpokenStoryCloze's folders of whole
# spoken stories (tasks/spoken_storycloze.py), scored S->S under the utterance protocol only.
RELEASE_FORMATS = ("story_pairs", "multiple_choice", "spoken_pairs")


@dataclasses.dataclass(frozen=True)
class PlannerSizes:
  """Typical sizes, for planning a run before any data is built (s2sjax.plan)."""

  questions: int
  prefix_tokens: int  # text tokens of a prefix
  candidate_tokens: int  # text tokens of one candidate
  seconds: float  # spoken prefix


@dataclasses.dataclass(frozen=True)
class Benchmark:
  name: str  # the --task value and the builder's folder
  title: str  # in tables and curves
  language: str  # picks the spec's templates (instruction, separator) and the TTS voice
  release_format: str  # one of RELEASE_FORMATS
  release_jsonl: str  # relative to the release directory
  release_audio_dir: str  # <uttid>.wav of each spoken prefix, relative to the release directory
  # Spoken candidates (T->S, S->S), an s2sjax extension of the layout: story_pairs <uttid>.wav (each line's
  # `last`), multiple_choice <uttid>_<A|B|C|D>.wav; relative to the release directory.
  release_candidate_audio_dir: str
  decision: str  # a key of s2sjax.metrics.DECISIONS: how losses become right/wrong
  candidates: int  # per question
  sizes: PlannerSizes
  builder: str = ""  # "module:Class" of the TFDS builder; default tasks.<name>.<name>_dataset_builder:Builder
  ties: str = "reference"  # s2sjax.metrics.TIE_RULES: how a tie counts (SlamKit's spoken StoryCloze: "half")

  def __post_init__(self):
    if self.release_format not in RELEASE_FORMATS:
      raise ValueError(f"task {self.name}: release_format {self.release_format!r} is not one of {RELEASE_FORMATS}")

  @property
  def has_text(self) -> bool:
    """Whether the release writes its questions (jsonl): a folder of whole recordings (spoken_pairs) does not, and is
    asked S->S only."""
    return self.release_format != "spoken_pairs"

  @property
  def builder_path(self) -> str:
    return self.builder or f"tasks.{self.name}.{self.name}_dataset_builder:Builder"


TASKS: Registry[Benchmark] = Registry("task")
register, names, get = TASKS.register, TASKS.names, TASKS.get


# S2SBench's three tasks: release files as the release ships them, sizes from its README (S2SBench's own
# sCMMLU selection of 4,743), typical lengths measured on the bundled sample and the replica.
register(Benchmark(
  "sstorycloze", "sStoryCloze", "en", "story_pairs", "StoryCloze/sStory_s2t.jsonl", "StoryCloze/s-story-firstspeech",
  "StoryCloze/s-story-lastspeech", decision="pair", candidates=2, sizes=PlannerSizes(1871, 60, 12, 9.0)))
register(Benchmark(
  "zh_sstorycloze", "zh-sStoryCloze", "zh", "story_pairs", "StoryCloze/zh_story.jsonl", "StoryCloze/zh_story",
  "StoryCloze/zh_story_last", decision="pair", candidates=2, sizes=PlannerSizes(1871, 60, 14, 12.0)))
register(Benchmark(
  "scmmlu", "sCMMLU", "zh", "multiple_choice", "cmmlu/cmmlu_rewrite_4.jsonl", "cmmlu/cmmlu_rewrite",
  "cmmlu/cmmlu_rewrite_options", decision="answer_vs_distractors", candidates=4, sizes=PlannerSizes(4743, 25, 6, 5.0)))
# TWIST's topic StoryCloze (Hassid et al., 2023): sStoryCloze's stories, the wrong ending the right ending of
# another story (tasks.importer.topic_stories, a fixed seed), so a model that only tracks the topic gets it right.
# Not part of the S2SBench release: the replica importer and the bundled sample write it, with a pairing of this
# project's own and espeak-ng speech, so it is titled "(replica)": its numbers are not TWIST's or Moshi's.
register(Benchmark(
  "tstorycloze", "tStoryCloze (replica)", "en", "story_pairs", "StoryCloze/tStory_s2t.jsonl", "StoryCloze/t-story-firstspeech",
  "StoryCloze/t-story-lastspeech", decision="pair", candidates=2, sizes=PlannerSizes(1871, 60, 12, 9.0)))
# The official spoken StoryCloze (slp-rl/SpokenStoryCloze, TWIST's sSC and tSC): whole spoken stories, read as
# SlamKit reads them (tasks/release.py _spoken_pairs), scored S->S under the utterance protocol with ties counted
# half, as SlamKit's modelling metric counts them: the protocol of TWIST's and Moshi's published numbers.
register(Benchmark(
  "spoken_sstorycloze", "SpokenStoryCloze sSC", "en", "spoken_pairs", "sSC", "sSC", "sSC", decision="pair",
  candidates=2, sizes=PlannerSizes(1871, 0, 0, 12.0), ties="half"))
register(Benchmark(
  "spoken_tstorycloze", "SpokenStoryCloze tSC", "en", "spoken_pairs", "tSC", "tSC", "tSC", decision="pair",
  candidates=2, sizes=PlannerSizes(1871, 0, 0, 12.0), ties="half"))
