"""The TFDS builder every task shares: pre-tokenized, packed rows written as array_record.

Each task's builder class is made from its record in `s2sjax.data.task_registry` (`builder_class`: what the task is,
release files and format, language, all come from the record), so a task is one registration; TFDS names its
folder after the task. One BuilderConfig per spec x modality x row length x variant (`demo-s2t-1024`, ...; names
from `s2sjax.data.builds.DataSelector`), each holding its resolved `BuildPlan`. The split `test` holds the packed rows
(the fields of the spec's input format, each in its dtype, plus a `row` index); `metadata.json` holds the question table
(which slots make each question, which candidate is right), counts, packing efficiency, truncations and skips,
the text tokenizer's identity and the audio tokenizer's fingerprint, what the build is (`build`: task, modality,
spec, row length, variants) and checksums of its rows and question table (`integrity`), which the evaluator holds
the folder to (s2sjax/data/task_data.py). Neither building nor reading needs TensorFlow.

Inputs: the S2SBench release under TFDS's manual_dir (default: the bundled sample; a manual_dir that does not
exist is an error), the text tokenizer (`tokenizer_dir`, default `<manual_dir>/tokenizer`; `tasks.prepare` gives
the embedded default model's for the `demo` spec), and for audio tokenizers with files, `audio_tokenizer_dir`.
A fingerprint of all of them (`inputs` in the metadata) lets `tasks.prepare` refuse to reuse rows built from
other inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from s2sjax.data import task_registry, modalities, text_tokenizer
from s2sjax.data.builds import BuildMetadata, BuildPlan, DataSelector
from s2sjax.runtime.errors import MissingFileError
from s2sjax.data.modalities import SPEECH
from s2sjax.runtime.output_dir import strict_json
from s2sjax.data.packing import fit
from s2sjax.data.spec import Spec, available_specs
from s2sjax.data.task_data import DATA_VERSION, questions_checksum
from tasks import audio
from tasks.build import PositionLimit, QuestionEncoder, build_rows, position_limit
from tasks.release import Problems, ReleaseError, check_asked, read_questions, release_paths, source_fingerprint
from tasks.sample import RELEASE_DIR

ROW_LENGTHS = (1024, 2048)
VERSION = tfds.core.Version(DATA_VERSION)


@dataclasses.dataclass(eq=False)
class S2SBenchConfig(tfds.core.BuilderConfig):
  plan: BuildPlan | None = None  # what the config builds, resolved (its name is the plan's); the task is the builder's


def make_config(plan: BuildPlan) -> S2SBenchConfig:
  length = plan.selector.row_length or "a length chosen from the items"
  return S2SBenchConfig(name=plan.config, version=VERSION, plan=plan,
                        description=f"{plan.spec.name} spec, {plan.modality.title}, rows of {length}")


def _askable(plan: BuildPlan) -> bool:
  try:
    plan.spec.check_modality(plan.modality)
    return True
  except ValueError:
    return False


def _default_configs() -> list[S2SBenchConfig]:
  plans = [DataSelector("", modality, spec, length).resolve()
           for spec in available_specs() for modality in modalities.NAMES for length in ROW_LENGTHS]
  return [make_config(plan) for plan in plans if _askable(plan)]


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
  limit: PositionLimit | None  # the most positions an item may read: the model's, or a smaller --max_item_tokens


class S2SBenchBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of every task's builder; `builder_class` makes each task's, whose TASK is a name in s2sjax.data.task_registry.

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
               skip_bad: bool = False, trust_remote_code: bool = False, max_item_tokens: int | None = None,
               plan: BuildPlan | None = None, audio_shapes: str = "auto", **kwargs):
    """`plan`: the build resolved by the caller (`tasks.preparation` resolves it once, the spec read as it is now);
    None: the config's own (a package preset's, resolved when this module was imported). `max_item_tokens`: the
    most positions an item may read, below the model's own (`tasks.build.position_limit`). `audio_shapes`: the JAX
    audio tokenizers' shape policy (tasks/audio/jax_tokenizer.py; the codes are the same under each)."""
    self.tokenizer_dir, self.audio_tokenizer_dir, self.skip_bad = tokenizer_dir, audio_tokenizer_dir, skip_bad
    self.max_item_tokens, self.audio_shapes = max_item_tokens, audio_shapes
    self.trust_remote_code = trust_remote_code  # a tokenizer shipped as code (GLM-4's) runs only when trusted
    self._inputs: BuildInputs | None = None
    self._plan = plan
    kwargs.setdefault("file_format", "array_record")  # random access, and no TensorFlow to write or read
    super().__init__(**kwargs)

  @property
  def plan(self) -> BuildPlan:
    """This builder's build: its task's, of the config's spec, modality, row length and variants."""
    return (self._plan or self.builder_config.plan).for_task(self.TASK)

  # TFDS prints these to stdout unconditionally; `tasks.prepare` prints its own report of every build.
  def _log_download_bytes(self) -> None:
    logging.info("building %s/%s in %s", self.name, self.builder_config.name, self.data_dir)

  def _log_download_done(self) -> None:
    logging.info("built %s/%s in %s", self.name, self.builder_config.name, self.data_dir)

  def _info(self) -> tfds.core.DatasetInfo:
    plan = self.plan
    # the target and slot tables are cut to what the rows use when they are built (packing.fit), and so is the
    # length when the build chooses it from its items
    length = None if plan.selector.row_length is None else plan.capacity.length
    dtypes = plan.row_format.dtypes()
    features = {"row": tfds.features.Scalar(dtype=np.int32)}
    for name, dims in plan.row_format.shapes(length, None, None, plan.widths).items():
      features[name] = tfds.features.Tensor(shape=dims, dtype=dtypes[name])
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(features), metadata=tfds.core.MetadataDict(),
      homepage="https://github.com/undobug/S2SBench",
    )

  def build_inputs(self, manual_dir: str) -> BuildInputs:
    """The spec and tokenizers (loaded once per builder) and the fingerprint of everything the rows come from."""
    if self._inputs is None or self._inputs.manual_dir != manual_dir:
      plan = self.plan
      spec, modality = plan.spec, plan.modality
      plan.check()  # before loading anything: what the spec cannot be asked, by name
      tokenizer = identity = tokenizer_dir = None  # a unit LM has no text tokenizer
      if spec.text_vocabulary:
        tokenizer_dir = resolve_tokenizer_dir(self.tokenizer_dir, manual_dir)
        tokenizer = text_tokenizer.load(tokenizer_dir, self.trust_remote_code)
        identity = text_tokenizer.folder_identity(tokenizer_dir, self.trust_remote_code)  # remembered, not rehashed
      audio_tokenizer = (audio.shared(audio.from_spec(spec.audio_tokenizer, spec.codebook_sizes,
                                                      self.audio_tokenizer_dir, shapes=self.audio_shapes))
                         if modality.speaks else None)
      decoded = []  # the wav folders whose bytes make the rows
      paths = release_paths(self.TASK, manual_dir)
      if audio_tokenizer is not None and audio_tokenizer.reads_audio:
        if modality.prefix == SPEECH or plan.variants.protocol == "utterance":
          decoded.append(paths.audio_dir)
        if modality.candidate == SPEECH:
          decoded.append(paths.candidate_dir)
      fingerprint = {
        "release": source_fingerprint(self.TASK, manual_dir, tuple(decoded)), "spec": spec.digest(),
        "text_tokenizer": identity["vocab_sha"] if identity else None,
        "audio_tokenizer": audio_tokenizer.fingerprint() if audio_tokenizer else None,
      }
      self._inputs = BuildInputs(manual_dir, spec, tokenizer, identity, audio_tokenizer, fingerprint,
                                 position_limit(self.max_item_tokens, tokenizer_dir))
    return self._inputs

  def _manual_dir(self, dl_manager) -> str:
    # TFDS passes <data_dir>/downloads/manual when no manual_dir was given: absent, it means "the sample"
    manual = getattr(dl_manager, "_manual_dir", None)
    unset = manual is None or (epath.Path(manual) == epath.Path(dl_manager._download_dir) / "manual"
                               and not epath.Path(manual).exists())
    return resolve_manual_dir(None if unset else str(manual))

  def _split_generators(self, dl_manager):
    plan = self.plan
    variants = plan.variants
    check_asked(self.TASK, plan.modality.name, variants.protocol)
    inputs = self.build_inputs(self._manual_dir(dl_manager))
    problems = Problems() if self.skip_bad else None
    questions = read_questions(self.TASK, inputs.manual_dir, problems=problems)
    encoder = QuestionEncoder(plan.spec, plan.modality.name, inputs.tokenizer, inputs.audio_tokenizer,
                              language_override="zh" if variants.reference_language_quirk else None,
                              protocol=variants.protocol, tokenization=variants.tokenization)
    built = build_rows(questions, encoder, plan.capacity, variants.share_prefix, self.skip_bad, variants.overlong,
                       auto_length=plan.selector.row_length is None,
                       progress=f"building {self.TASK} {plan.modality.title}", limit=inputs.limit)
    rows, shape = fit(built.rows, built.shape, built.packing.longest_item)
    summary = built.summary()
    # lines that name no question (not UTF-8, not JSON, no uttid): listed with the rest, counted apart
    summary["unreadable_lines"] = len(problems.entries) - len(problems.attributed) if problems else 0
    if problems:
      summary["skipped"] += len(problems.questions)  # questions, not problems: a story's two lines are one
      summary["skipped_questions"] = ([{"where": w, "why": y} for w, y in problems.entries]
                                      + summary["skipped_questions"])
    summary["file_problems"] = [{"where": w, "why": y} for w, y in (problems.file_entries if problems else [])]
    stored = plan.row_format.stored(rows, plan.widths)
    records = built.table.to_records()
    audio_tokenizer = inputs.audio_tokenizer
    metadata = BuildMetadata(
      task=self.TASK, modality=plan.modality.name, spec=plan.spec, row_shape=shape, variants=variants,
      source=inputs.manual_dir, tokenizer=inputs.tokenizer_identity,
      audio_tokenizer=(dict(audio_tokenizer.identity(), fingerprint=audio_tokenizer.fingerprint())
                       if audio_tokenizer else None),
      audio_ids=encoder.ids, inputs=inputs.fingerprint, report=summary, questions=tuple(records),
      build=plan.selector.record(),
      integrity={"rows": plan.row_format.checksum(stored), "questions": questions_checksum(records)})
    # TFDS would write a NaN as bare NaN
    self.info.metadata.update(json.loads(strict_json(metadata.to_json(), f"{self.TASK}/{plan.config} metadata.json")))
    return {"test": self._generate_examples(stored)}

  def _generate_examples(self, rows: dict[str, np.ndarray]):
    for r in range(len(rows["segment_ids"])):
      yield r, dict({name: rows[name][r] for name in rows}, row=r)


@functools.cache
def builder_class(task: str) -> type[S2SBenchBuilder]:
  """The task's TFDS builder, made from its record and registered with TFDS under the task's name (its data
  folder's, and what `tfds.builder(task)` finds). One class per task and process (TFDS keeps state per class)."""
  task_registry.get(task)  # an unknown task is refused, naming the known ones
  return type(f"{task.title().replace('_', '')}Builder", (S2SBenchBuilder,),
              {"name": task, "TASK": task, "__module__": __name__, "__doc__": f"{task}'s packed rows."})


# The package's tasks have their builders once this module is imported; a plugin's, when it is first asked for.
for _record in task_registry.TASKS.registered():
  builder_class(_record.name)
