"""The TFDS builder every task shares: pre-tokenized, packed rows written as array_record.

A task's builder file (`tasks/<task>/<task>_dataset_builder.py`) only names its task; what the task is (release
files and format, language) comes from its record in `s2sjax.benchmarks`. One BuilderConfig per spec x modality x
row length x variant (`demo-s2t-1024`, ...; names from `s2sjax.builds.DataSelector`). The split `test` holds
the packed rows (docs/architecture.md's row format plus a `row` index); `metadata.json` holds the question table
(which slots make each question, which candidate is right), counts, packing efficiency, truncations and skips,
the text tokenizer's identity and the audio tokenizer's fingerprint, what the build is (`build`: task, modality,
spec, row length, variants) and checksums of its rows and question table (`integrity`), which the evaluator holds
the folder to (s2sjax/task_data.py). Neither building nor reading needs TensorFlow.

Inputs: the S2SBench release under TFDS's manual_dir (default: the bundled sample; a manual_dir that does not
exist is an error), the text tokenizer (`tokenizer_dir`, default `<manual_dir>/tokenizer`; `tasks.prepare` gives
the embedded default model's for the `demo` spec), and for audio tokenizers with files, `audio_tokenizer_dir`.
A fingerprint of all of them (`inputs` in the metadata) lets `tasks.prepare` refuse to reuse rows built from
other inputs.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from s2sjax import modalities, text_tokenizer
from s2sjax.builds import BuildMetadata, DataSelector, spec_label
from s2sjax.errors import MissingFileError
from s2sjax.modalities import SPEECH
from s2sjax.output_dir import strict_json
from s2sjax.packing import RowShape, fit
from s2sjax.spec import Spec, available_specs, load_spec
from s2sjax.task_data import DATA_VERSION, questions_checksum, rows_checksum, tokenizer_identity
from tasks import audio
from tasks.build import QuestionEncoder, build_rows
from tasks.release import (Problems, ReleaseError, candidate_audio_dir, check_asked, read_questions, source_fingerprint,
                           task_paths)
from tasks.sample import RELEASE_DIR

ROW_LENGTHS = (1024, 2048)
AUTO_MAX_LENGTH = 16384  # a build without a row length refuses items longer than this
VERSION = tfds.core.Version(DATA_VERSION)


@dataclasses.dataclass(eq=False)
class S2SBenchConfig(tfds.core.BuilderConfig):
  selector: DataSelector | None = None  # what the config builds (its name is the selector's); the task is the builder's

  @property
  def row_shape(self) -> RowShape:
    """The rows' capacity before the build fits its tables to what they hold."""
    spec = load_spec(self.selector.spec)
    modality = modalities.get(self.selector.modality)
    codebooks = len(spec.codebook_sizes) if (modality.prefix == SPEECH and spec.audio_mode == "codebook_tables") else 0
    if spec.row_format.streams:  # every row carries the text stream and each codebook's
      codebooks = len(spec.codebook_sizes)
    shape = RowShape.for_length(self.selector.row_length or AUTO_MAX_LENGTH, codebooks)
    # spoken candidates run to hundreds of units (a whole story, in the utterance protocol): any token may be scored
    return dataclasses.replace(shape, max_targets=shape.length) if modality.candidate == SPEECH else shape


def make_config(selector: DataSelector) -> S2SBenchConfig:
  length = selector.row_length or "a length chosen from the items"
  return S2SBenchConfig(name=selector.config, version=VERSION, selector=selector,
                        description=f"{spec_label(selector.spec)} spec, {modalities.get(selector.modality).title}, "
                                    f"rows of {length}")


def _askable(spec: str, modality: str) -> bool:
  try:
    load_spec(spec).check_modality(modalities.get(modality))
    return True
  except ValueError:
    return False


def _default_configs() -> list[S2SBenchConfig]:
  return [make_config(DataSelector("", modality, spec, length))
          for spec in available_specs() for modality in modalities.NAMES for length in ROW_LENGTHS
          if _askable(spec, modality)]


def resolve_tokenizer_dir(tokenizer_dir: str | None, manual_dir: str) -> str:
  """The text tokenizer's local directory; one that does not exist is an error (transformers would try the hub)."""
  if tokenizer_dir:
    path, why = tokenizer_dir, "--tokenizer_dir"
  else:
    path, why = os.path.join(manual_dir, "tokenizer"), "the default: <manual_dir>/tokenizer"
  if not os.path.isdir(path):
    raise MissingFileError(f"text tokenizer directory {path} ({why}) does not exist: pass --tokenizer_dir")
  return path


def resolve_manual_dir(manual_dir: str | None) -> str:
  """The release directory: the bundled sample when none is given; a given one must exist."""
  if not manual_dir:
    return RELEASE_DIR
  if not os.path.isdir(manual_dir):
    raise ReleaseError(f"--manual_dir {manual_dir} does not exist (it should hold the S2SBench release)")
  return str(manual_dir)


@dataclasses.dataclass(frozen=True)
class BuildInputs:
  """Everything a build reads, loaded once, and the fingerprint of each part (recorded as metadata `inputs`)."""

  manual_dir: str
  spec: Spec
  tokenizer: object
  tokenizer_identity: dict
  audio_tokenizer: audio.AudioTokenizer | None
  fingerprint: dict[str, str | None]


class S2SBenchBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of every task's builder; subclasses set TASK (a name in s2sjax.benchmarks).

  Build inputs that do not change what the rows mean (where the tokenizers live, whether bad questions are
  skipped) are constructor arguments, not config fields, so a config name always says what its rows are."""

  TASK: str = ""
  VERSION = VERSION
  BUILDER_CONFIGS = _default_configs()
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "Place the S2SBench release (StoryCloze/ and cmmlu/ with their jsonl files and wav folders) in manual_dir; "
    "without one, the bundled sample in tasks/sample/release is used. Put the text tokenizer in "
    "<manual_dir>/tokenizer or set tokenizer_dir."
  )

  def __init__(self, *, tokenizer_dir: str | None = None, audio_tokenizer_dir: str | None = None,
               skip_bad: bool = False, trust_remote_code: bool = False, **kwargs):
    self.tokenizer_dir, self.audio_tokenizer_dir, self.skip_bad = tokenizer_dir, audio_tokenizer_dir, skip_bad
    self.trust_remote_code = trust_remote_code  # a tokenizer shipped as code (GLM-4's) runs only when trusted
    self._inputs: BuildInputs | None = None
    kwargs.setdefault("file_format", "array_record")  # random access, and no TensorFlow to write or read
    super().__init__(**kwargs)

  # TFDS prints these to stdout unconditionally; `tasks.prepare` prints its own report of every build.
  def _log_download_bytes(self) -> None:
    logging.info("building %s/%s in %s", self.name, self.builder_config.name, self.data_dir)

  def _log_download_done(self) -> None:
    logging.info("built %s/%s in %s", self.name, self.builder_config.name, self.data_dir)

  def _info(self) -> tfds.core.DatasetInfo:
    shape = self.builder_config.row_shape
    # the target and slot tables are cut to what the rows use when they are built (packing.fit), and so is the
    # length when the build chooses it from its items
    row_format = load_spec(self.builder_config.selector.spec).row_format
    length = None if self.builder_config.selector.row_length is None else shape.length
    features = {"row": tfds.features.Scalar(dtype=np.int32)}
    for name, dims in row_format.shapes(length, None, None, row_format.width(shape)).items():
      features[name] = tfds.features.Tensor(shape=dims, dtype=np.int32)
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(features), metadata=tfds.core.MetadataDict(),
      homepage="https://github.com/undobug/S2SBench",
    )

  def build_inputs(self, manual_dir: str) -> BuildInputs:
    """The spec and tokenizers (loaded once per builder) and the fingerprint of everything the rows come from."""
    if self._inputs is None or self._inputs.manual_dir != manual_dir:
      selector = self.builder_config.selector
      spec = load_spec(selector.spec)
      modality = modalities.get(selector.modality)
      spec.check_modality(modality)  # before loading anything: what the spec cannot be asked, by name
      tokenizer = (text_tokenizer.load(resolve_tokenizer_dir(self.tokenizer_dir, manual_dir), self.trust_remote_code)
                   if spec.text_vocabulary else None)  # a unit LM has none
      audio_tokenizer = (audio.from_spec(spec.audio_tokenizer, spec.codebook_sizes, self.audio_tokenizer_dir)
                         if modality.speaks else None)
      identity = tokenizer_identity(tokenizer) if tokenizer is not None else None
      decoded = []  # the wav folders whose bytes make the rows
      if audio_tokenizer is not None and audio_tokenizer.reads_audio:
        if modality.prefix == SPEECH or selector.variants.protocol == "utterance":
          decoded.append(task_paths(self.TASK, manual_dir)[1])
        if modality.candidate == SPEECH:
          decoded.append(candidate_audio_dir(self.TASK, manual_dir))
      fingerprint = {
        "release": source_fingerprint(self.TASK, manual_dir, tuple(decoded)), "spec": spec.digest(),
        "text_tokenizer": identity["vocab_sha"] if identity else None,
        "audio_tokenizer": audio_tokenizer.fingerprint() if audio_tokenizer else None,
      }
      self._inputs = BuildInputs(manual_dir, spec, tokenizer, identity, audio_tokenizer, fingerprint)
    return self._inputs

  def _manual_dir(self, dl_manager) -> str:
    # TFDS passes <data_dir>/downloads/manual when no manual_dir was given: absent, it means "the sample"
    manual = getattr(dl_manager, "_manual_dir", None)
    unset = manual is None or (epath.Path(manual) == epath.Path(dl_manager._download_dir) / "manual"
                               and not epath.Path(manual).exists())
    return resolve_manual_dir(None if unset else str(manual))

  def _split_generators(self, dl_manager):
    config = self.builder_config
    selector = dataclasses.replace(config.selector, task=self.TASK)
    variants = selector.variants
    check_asked(self.TASK, selector.modality, variants.protocol)
    inputs = self.build_inputs(self._manual_dir(dl_manager))
    spec, tokenizer, audio_tokenizer = inputs.spec, inputs.tokenizer, inputs.audio_tokenizer
    problems = Problems() if self.skip_bad else None
    questions = read_questions(self.TASK, inputs.manual_dir, problems=problems)
    encoder = QuestionEncoder(spec, selector.modality, tokenizer, audio_tokenizer,
                              language_override="zh" if variants.reference_language_quirk else None,
                              protocol=variants.protocol, tokenization=variants.tokenization)
    rows, table, summary = build_rows(questions, encoder, config.row_shape, variants.share_prefix, self.skip_bad,
                                      variants.overlong, auto_length=selector.row_length is None,
                                      progress=f"building {self.TASK} {modalities.get(selector.modality).title}")
    rows, shape = fit(rows, config.row_shape.with_length(summary["row_length"]), summary["longest_item"])
    # lines that name no question (not UTF-8, not JSON, no uttid): listed with the rest, counted apart
    summary["unreadable_lines"] = len(problems.entries) - len(problems.attributed) if problems else 0
    if problems:
      summary["skipped"] += len(problems.questions)  # questions, not problems: a story's two lines are one
      summary["skipped_questions"] = ([{"where": w, "why": y} for w, y in problems.entries]
                                      + summary["skipped_questions"])
    summary["file_problems"] = [{"where": w, "why": y} for w, y in (problems.file_entries if problems else [])]
    stored = spec.row_format.stored(rows, spec.row_format.width(config.row_shape))
    records = table.to_records()
    metadata = BuildMetadata(
      task=self.TASK, modality=selector.modality, spec=spec, row_shape=shape, variants=variants,
      source=inputs.manual_dir, tokenizer=inputs.tokenizer_identity,
      audio_tokenizer=(dict(audio_tokenizer.identity(), fingerprint=audio_tokenizer.fingerprint())
                       if audio_tokenizer else None),
      audio_ids=encoder.ids, inputs=inputs.fingerprint, report=summary, questions=tuple(records),
      build=selector.record(), integrity={"rows": rows_checksum(stored), "questions": questions_checksum(records)})
    # TFDS would write a NaN as bare NaN
    self.info.metadata.update(json.loads(strict_json(metadata.to_json(), f"{self.TASK}/{config.name} metadata.json")))
    return {"test": self._generate_examples(stored)}

  def _generate_examples(self, rows: dict[str, np.ndarray]):
    for r in range(len(rows["segment_ids"])):
      yield r, dict({name: rows[name][r] for name in rows}, row=r)
