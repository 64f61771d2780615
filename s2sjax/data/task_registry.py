"""The task registry: one record per benchmark, read by everything that needs to know a task, and the release
layouts its records name.

The release reader and the TFDS builders (`tasks`: one builder class per task, made from its record), the metrics (the
decision rule), the result tables (titles), the planner (sizes), the command lines (`--task` choices) and the sample
maker all look a task up here; none of them lists tasks. Adding a benchmark is one `register(Task(...))`
(docs/architecture.md, "Adding a task"); a release laid out in a new way is one `RELEASE_FORMATS.register(
ReleaseFormat(...))`, its reader registered by the build stage (tasks/release.py, `READERS`). A module of your own
that registers them is found through `S2SJAX_PLUGINS` (s2sjax/runtime/plugins.py).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from s2sjax.data import modalities
from s2sjax.runtime.registry import Registry


@dataclasses.dataclass(frozen=True)
class ReleaseFormat:
  """How a release lays a task's questions out (a record's `release_format`).

  The build stage registers, under its name, the reader that turns the release into questions (tasks/release.py,
  `READERS`); what it gives is held to `Question`'s field types and the record's candidate count
  (tasks.release.check_questions), naming the format and the record. `modalities` are what its questions can be
  asked and `protocols` how their S->S can be scored (None: any; the other modalities have one protocol). `index` is what the record's `release_jsonl` names, and
  so what a build's fingerprint hashes besides the recordings it decodes: a `file` (its bytes) or a `folder` (its
  recordings). `lines_per_question` of the index (a sample of the release keeps whole questions)."""

  name: str
  summary: str  # what its questions are, in messages
  modalities: tuple[str, ...] = modalities.NAMES
  protocols: tuple[str, ...] | None = None
  index: str = "file"
  lines_per_question: int | None = None
  # Its questions are pairs of whole recordings that a toolkit compares one against the other (SlamKit's): each
  # scores file gets a per-pair file beside it in that toolkit's terms (s2sjax/results/pair_items.py).
  pair_items: bool = False

  def __post_init__(self):
    if self.index not in ("file", "folder") or not set(self.modalities) <= set(modalities.NAMES):
      raise ValueError(f"release format {self.name}: index {self.index!r} (file, folder) or modalities "
                       f"{self.modalities} ({', '.join(modalities.NAMES)})")

  @property
  def has_text(self) -> bool:
    """Whether its questions are written (T->T, S->T can be asked): a folder of whole recordings is not."""
    return any(modalities.get(name).reads_text for name in self.modalities)


RELEASE_FORMATS: Registry[ReleaseFormat] = Registry("release format")
# S2SBench's jsonl layouts, and slp-rl/SpokenStoryCloze's folders of whole spoken stories, read as SlamKit reads
# them: each read by the reader tasks/release.py registers (SlamKit's layouts' in tasks/slamkit.py).
RELEASE_FORMATS.register(ReleaseFormat(
  "story_pairs", "stories, lines `uttid, first, last`: uttid 2k the right ending, 2k+1 the wrong one of the same "
  "story", lines_per_question=2))
RELEASE_FORMATS.register(ReleaseFormat(
  "multiple_choice", "four-option questions, lines `uttid, first, A, B, C, D, answer`", lines_per_question=1))
RELEASE_FORMATS.register(ReleaseFormat(
  "spoken_pairs", "whole spoken stories, no text and no separate prefix", modalities=("s2s",),
  protocols=("utterance",), index="folder", pair_items=True))
# ZeroSpeech 2021's sLM21 (sWUGGY lexical/, sBLIMP syntactic/): a gold.csv pairing the recordings beside it, read as
# zerospeech-benchmarks 0.9.4 reads it (tasks/zerospeech.py); each recording scored whole, or its gold text T->T.
RELEASE_FORMATS.register(ReleaseFormat(
  "slm21_lexical", "words against non-words, recordings paired by (id, voice) in gold.csv",
  modalities=("t2t", "s2s"), protocols=("utterance",)))
RELEASE_FORMATS.register(ReleaseFormat(
  "slm21_syntactic", "grammatical against ungrammatical sentences, recordings paired by position in gold.csv",
  modalities=("t2t", "s2s"), protocols=("utterance",)))
# SlamKit's cross-modal StoryCloze folders (tasks/slamkit.py read_cross_modal_pairs): every story's prefix and
# endings spoken and written, so every modality can be asked.
RELEASE_FORMATS.register(ReleaseFormat(
  "cross_modal_pairs", "stories as SlamKit's cross-modal folders, <base>_{mutual,correct,incorrect}.{wav,txt}",
  index="folder", pair_items=True))
# The spoken-LM neighbours, read as their own toolkits read them (tasks/prosaudit.py, tasks/salmon.py): whole
# recordings in pairs, no prefix; their transcriptions (ProsAudit's) are the same words in both, so only S->S asks
# anything.
RELEASE_FORMATS.register(ReleaseFormat(
  "prosaudit", "ZeroSpeech ProsAudit: a folder of recordings and its gold.csv, pairs of one sentence with a pause "
  "at a natural and an unnatural place", modalities=("s2s",), protocols=("utterance",)))
RELEASE_FORMATS.register(ReleaseFormat(
  "salmon", "a SALMon part: sample_<i>_0.wav (positive) and sample_<i>_1.wav (negative), whole recordings",
  modalities=("s2s",), protocols=("utterance",), index="folder", pair_items=True))


@dataclasses.dataclass(frozen=True)
class PlannerSizes:
  """Typical sizes, for planning a run before any data is built (s2sjax.plan)."""

  questions: int
  prefix_tokens: int  # text tokens of a prefix
  candidate_tokens: int  # text tokens of one candidate
  seconds: float  # spoken prefix


@dataclasses.dataclass(frozen=True)
class Task:
  name: str  # the --task value and the builder's folder
  title: str  # in tables and curves
  language: str  # picks the spec's templates (instruction, separator) and the TTS voice
  release_format: str  # the name of a registered ReleaseFormat
  release_jsonl: str  # relative to the release directory
  release_audio_dir: str  # <uttid>.wav of each spoken prefix, relative to the release directory
  # Spoken candidates (T->S, S->S), an s2sjax extension of the layout: story_pairs <uttid>.wav (each line's
  # `last`), multiple_choice <uttid>_<A|B|C|D>.wav; relative to the release directory.
  release_candidate_audio_dir: str
  decision: str  # the name of a rule in s2sjax.data.metrics.DECISIONS: how losses become right/wrong
  candidates: int  # per question
  sizes: PlannerSizes
  ties: str = "reference"  # s2sjax.data.metrics.TIE_RULES: how a tie counts (SlamKit's spoken StoryCloze: "half")
  # LOSSES (below): a candidate's loss from its token NLLs, "mean" (S2SBench's) or "sum" (minus the
  # recording's log-probability, where a toolkit scores that: ZeroSpeech's submissions).
  loss: str = "mean"
  # A question label (tasks.release.Question.labels): the questions sharing its value are averaged first and the
  # accuracy is the mean over those groups (ZeroSpeech's sLM21: a pair's voices, then the mean over pairs).
  averaged_over: str | None = None
  breakdowns: tuple[str, ...] = ()  # question labels metrics.json breaks the accuracy down by (`by_<label>`)

  @property
  def release(self) -> ReleaseFormat:
    """How its release is laid out."""
    return RELEASE_FORMATS.get(self.release_format)

  @property
  def has_text(self) -> bool:
    """Whether the release writes its questions: a folder of whole recordings does not, and is asked S->S only."""
    return self.release.has_text


LOSSES = ("mean", "sum")


def _problems(new: Task, registered: Mapping[str, Task]) -> list[str]:
  known = [f.name for f in RELEASE_FORMATS.registered()]
  problems = [] if new.release_format in known else [f"release_format {new.release_format!r} is not one of "
                                                     f"{', '.join(known)} (register its ReleaseFormat first)"]
  if new.loss not in LOSSES:
    problems.append(f"loss {new.loss!r} is not one of {', '.join(LOSSES)}")
  if not isinstance(new.breakdowns, tuple):
    problems.append(f"breakdowns {new.breakdowns!r} is not a tuple of label names")
  return problems


TASKS: Registry[Task] = Registry("task", check=_problems)
register, names, get = TASKS.register, TASKS.names, TASKS.get


# S2SBench's three tasks: release files as the release ships them, sizes from its README (S2SBench's own
# sCMMLU selection of 4,743), typical lengths measured on the bundled sample and the replica.
register(Task(
  "sstorycloze", "sStoryCloze", "en", "story_pairs", "StoryCloze/sStory_s2t.jsonl", "StoryCloze/s-story-firstspeech",
  "StoryCloze/s-story-lastspeech", decision="pair", candidates=2, sizes=PlannerSizes(1871, 60, 12, 9.0)))
register(Task(
  "zh_sstorycloze", "zh-sStoryCloze", "zh", "story_pairs", "StoryCloze/zh_story.jsonl", "StoryCloze/zh_story",
  "StoryCloze/zh_story_last", decision="pair", candidates=2, sizes=PlannerSizes(1871, 60, 14, 12.0)))
register(Task(
  "scmmlu", "sCMMLU", "zh", "multiple_choice", "cmmlu/cmmlu_rewrite_4.jsonl", "cmmlu/cmmlu_rewrite",
  "cmmlu/cmmlu_rewrite_options", decision="answer_vs_distractors", candidates=4, sizes=PlannerSizes(4743, 25, 6, 5.0)))
# TWIST's topic StoryCloze (Hassid et al., 2023): sStoryCloze's stories, the wrong ending the right ending of
# another story (tasks.importer.topic_stories, a fixed seed), so a model that only tracks the topic gets it right.
# Not part of the S2SBench release: the replica importer and the bundled sample write it, with a pairing of this
# project's own and espeak-ng speech, so it is titled "(replica)": its numbers are not TWIST's or Moshi's.
register(Task(
  "tstorycloze", "tStoryCloze (replica)", "en", "story_pairs", "StoryCloze/tStory_s2t.jsonl", "StoryCloze/t-story-firstspeech",
  "StoryCloze/t-story-lastspeech", decision="pair", candidates=2, sizes=PlannerSizes(1871, 60, 12, 9.0)))
# The official spoken StoryCloze (slp-rl/SpokenStoryCloze, TWIST's sSC and tSC): whole spoken stories, read as
# SlamKit reads them (tasks/slamkit.py read_spoken_pairs), scored S->S under the utterance protocol with ties counted
# half, as SlamKit's modelling metric counts them: the protocol of TWIST's and Moshi's published numbers.
register(Task(
  "spoken_sstorycloze", "SpokenStoryCloze sSC", "en", "spoken_pairs", "sSC", "sSC", "sSC", decision="pair",
  candidates=2, sizes=PlannerSizes(1871, 0, 0, 12.0), ties="half"))
register(Task(
  "spoken_tstorycloze", "SpokenStoryCloze tSC", "en", "spoken_pairs", "tSC", "tSC", "tSC", decision="pair",
  candidates=2, sizes=PlannerSizes(1871, 0, 0, 12.0), ties="half"))
# ZeroSpeech 2021's sLM21 dev sets (zerospeech-benchmarks 0.9.4's sLM21-dataset, the layout of tasks/zerospeech.py),
# and its test sets where a release holds their gold files. Scored as the toolkit scores a submission: a recording's
# score is its log-probability, so a candidate's loss is its summed NLL (the ZeroSpeech 2021 baseline writes a
# recording's summed (pseudo) log-probability: zerospeech2021_baseline scripts/compute_proba_BERT.py), a tie counts
# half (tasks/lm/lexical.py:79-82), sWUGGY's pairs are averaged over voices per id and sBLIMP's per (type, subtype,
# id) (lexical.py:86-91, syntactic.py:35-40). Sizes: rough pair counts (pairs x voices), for planning only.
def _register_slm21(split: str, swuggy_pairs: int, sblimp_pairs: int) -> None:
  suffix = "" if split == "dev" else f"_{split}"
  register(Task(
    f"swuggy{suffix}", f"sWUGGY ({split})", "en", "slm21_lexical", f"lexical/{split}/gold.csv", f"lexical/{split}",
    f"lexical/{split}", decision="pair", candidates=2, sizes=PlannerSizes(swuggy_pairs, 0, 3, 0.8), ties="half",
    loss="sum", averaged_over="id", breakdowns=("frequency_band", "in_vocabulary", "length")))
  register(Task(
    f"sblimp{suffix}", f"sBLIMP ({split})", "en", "slm21_syntactic", f"syntactic/{split}/gold.csv",
    f"syntactic/{split}", f"syntactic/{split}", decision="pair", candidates=2,
    sizes=PlannerSizes(sblimp_pairs, 0, 10, 2.5), ties="half", loss="sum", averaged_over="item",
    breakdowns=("type", "subtype")))


_register_slm21("dev", 20000, 6300)
_register_slm21("test", 60000, 18900)
# SlamKit's other StoryCloze layouts (slp-rl/slamkit config/metric/): the multi-speaker folders (ms_ssc.yaml,
# ms_tsc.yaml: `subfolder: true`, a folder of speakers' folders, read as spoken_pairs) and the cross-modal stories
# (cm_ms_tsc.yaml: cross_ms_tSC, a folder of folders of <base>_{mutual,correct,incorrect}.{wav,txt}; its sSC
# counterpart is named here by the same pattern). Scored as SlamKit scores them: ties half, each candidate's mean NLL
# (SlamKit's mean_nll, config/metric/default.yaml), the accuracy also broken down by folder (a speaker's).
for _name, _title, _format, _folder, _sizes in (
    ("spoken_ms_sstorycloze", "SpokenStoryCloze ms-sSC", "spoken_pairs", "ms_sSC", PlannerSizes(1871, 0, 0, 12.0)),
    ("spoken_ms_tstorycloze", "SpokenStoryCloze ms-tSC", "spoken_pairs", "ms_tSC", PlannerSizes(1871, 0, 0, 12.0)),
    ("cm_sstorycloze", "cross-modal sSC", "cross_modal_pairs", "cross_ms_sSC", PlannerSizes(1871, 60, 12, 9.0)),
    ("cm_tstorycloze", "cross-modal tSC", "cross_modal_pairs", "cross_ms_tSC", PlannerSizes(1871, 60, 12, 9.0))):
  register(Task(_name, _title, "en", _format, _folder, _folder, _folder, decision="pair", candidates=2, sizes=_sizes,
                ties="half", breakdowns=("folder",)))

# ZeroSpeech's ProsAudit (zerospeech-benchmarks 0.9.4, zerospeech/tasks/lm/prosody.py): the dataset's english/dev
# and english/test, each recording scored by its log-probability (the summed NLL: zrc reads one pseudo-probability
# per file, the sLM21 baselines' sum, docs/prosAudit.md:27-35), ties half, averaged over voices per (type, id), then
# per type: protosyntax and lexical, its two subtasks. Sizes are planning estimates, not the release's counts.
for _subset in ("dev", "test"):
  register(Task(
    f"prosaudit_{_subset}", f"ProsAudit ({_subset})", "en", "prosaudit", f"english/{_subset}/gold.csv",
    f"english/{_subset}", f"english/{_subset}", decision="pair", candidates=2, sizes=PlannerSizes(4000, 0, 0, 3.0),
    ties="half", loss="sum", averaged_over="type_id", breakdowns=("type",)))
# SALMon (slp-rl/salmon): one task per part, as salmon.py prints one accuracy per part (salmon.py:91-112) and its
# leaderboard has one column each; each recording's mean NLL (its configs' and SlamKit's mean_nll: true), positive
# against negative, ties half (salmon.py:105-107). 200 samples a part (data_generation/README.MD: --num-samples 200).
SALMON_PARTS = {  # folder -> the leaderboard's column, in salmon.py's order (salmon.py:78-87)
  "bg_alignment": "Background Alignment", "bg_all_consistency": "Background Consistency (Random)",
  "bg_domain_consistency": "Background Consistency (In-Domain)", "gender_consistency": "Gender Consistency",
  "rir_consistency": "Room Consistency", "sentiment_alignment": "Sentiment Alignment",
  "sentiment_consistency": "Sentiment Consistency", "speaker_consistency": "Speaker Consistency"}
for _part, _title in SALMON_PARTS.items():
  register(Task(f"salmon_{_part}", f"SALMon {_title}", "en", "salmon", _part, _part, _part, decision="pair",
                candidates=2, sizes=PlannerSizes(200, 0, 0, 5.0), ties="half"))
