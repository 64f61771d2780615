"""What names a build, what it resolves to and what it records: `DataSelector`, `BuildPlan`, `BuildMetadata`.

A `DataSelector` (task, modality, spec, row length, variants) is one build as `tasks.prepare` makes it and
`s2sjax.eval` reads it: it names its TFDS config (`demo-s2t-1024`, `-noshare`, ...) and its record, so the build and
the reader cannot disagree. `resolve()` turns it into a `BuildPlan` once: the spec loaded, the modality, the input
format and the rows' capacity, which the builder and its encoder are handed. `selectors` expands what a command
line asks for into builds by one rule (a protocol for the modalities it scores, a tokenization for T->T only);
`define_flags` / `from_flags` declare and read that command line once for both commands. How S->S may be scored
(`PROTOCOLS`) is a registry of records, as tasks are.

`BuildMetadata` is what a build writes beside its rows (TFDS's `metadata.json`) and the evaluator reads: typed
fields, one JSON layout (`to_json` / `from_json`; past the four every build has, a field left out reads as its
default).
"""

from __future__ import annotations

import dataclasses
import re

from absl import flags

from s2sjax.data import task_registry, formats, modalities
from s2sjax.runtime.errors import UserError
from s2sjax.data.modalities import SPEECH, Label, Modality
from s2sjax.data.packing import RowShape
from s2sjax.runtime.registry import Registry
from s2sjax.data.rows import RowFormat
from s2sjax.data.spec import AudioIds, Spec, is_spec_path, load_spec, spec_from_dict

OVERLONG = ("error", "truncate_prefix")
TOKENIZATIONS = ("separate", "joint")
AUTO = None  # a row length chosen from the items (s2sjax.data.packing.auto_row_length): configs named `-auto`
AUTO_MAX_LENGTH = 16384  # a build without a row length refuses items longer than this


class DataError(UserError, ValueError):
  """Built data that is missing, damaged or does not fit; the message says what to run."""


class VariantError(UserError, ValueError):
  """A build variant (--protocol, --overlong, --tokenization, or a build's metadata) that is not one there is."""


@dataclasses.dataclass(frozen=True)
class Protocol:
  """How a modality's candidates are laid and scored (tasks/encoders.py lays them): `modalities` it applies to
  (None: every one), and what it adds to a build's config name."""

  name: str
  modalities: tuple[str, ...] | None
  suffix: str
  summary: str


PROTOCOLS: Registry[Protocol] = Registry(
  "protocol", unknown=lambda name, known: f"protocol must be one of {tuple(known)}, not {name!r}", error=VariantError)
PROTOCOLS.register(Protocol(modalities.DEFAULT_PROTOCOL, None, "", "prefix + candidate, the candidate's tokens scored"))
PROTOCOLS.register(Protocol("utterance", ("s2s",), "-utterance", "TWIST / SlamKit: the whole spoken story as one "
                            "recording, every unit after bos scored"))


@dataclasses.dataclass(frozen=True)
class Variants:
  """The build options that change the rows, and so name another built config."""

  share_prefix: bool = True
  reference_language_quirk: bool = False  # S2SBench's code applies the last dataset's language (zh) to all
  overlong: str = "error"  # or "truncate_prefix": drop prefix tokens of items longer than the row (counted)
  # "s2sbench": prefix + candidate, the candidate's tokens scored; "utterance" (S->S only): TWIST / SlamKit's
  # whole spoken story, every unit after bos scored (tasks/encoders.py)
  protocol: str = "s2sbench"
  # T->T: "separate" tokenizes prefix and candidate apart (the scored tokens are exactly the candidate's);
  # "joint" is S2SBench's reference rule: first + last as one string, the tokens past the prefix's count scored
  tokenization: str = "separate"

  def __post_init__(self):
    if self.overlong not in OVERLONG:
      raise VariantError(f"overlong must be one of {OVERLONG}, not {self.overlong!r}")
    PROTOCOLS.get(self.protocol)
    if self.tokenization not in TOKENIZATIONS:
      raise VariantError(f"tokenization must be one of {TOKENIZATIONS}, not {self.tokenization!r}")

  @property
  def suffix(self) -> str:
    """What the variants add to a config's name."""
    return (("" if self.share_prefix else "-noshare") + ("-zhquirk" if self.reference_language_quirk else "")
            + ("-truncate" if self.overlong == "truncate_prefix" else "")
            + PROTOCOLS.get(self.protocol).suffix + ("-joint" if self.tokenization == "joint" else ""))


def spec_label(spec: str, loaded: Spec | None = None) -> str:
  """A preset's name; for a YAML path, the spec's own name and a hash of its resolved contents (a path would put
  slashes in the config name, and two files may carry one name). `loaded`: the spec, when it is at hand."""
  if not is_spec_path(spec):
    return spec
  loaded = loaded or load_spec(spec)
  return f"{re.sub(r'[^A-Za-z0-9_.]+', '_', loaded.name)}-{loaded.digest()[:8]}"


@dataclasses.dataclass(frozen=True)
class DataSelector:
  """One build: a task in one modality, built with a spec (a preset's name or a YAML path) into rows of
  `row_length` (AUTO: chosen from the items) with `variants`."""

  task: str
  modality: str
  spec: str = "demo"
  row_length: int | None = AUTO
  variants: Variants = Variants()

  def __post_init__(self):
    object.__setattr__(self, "modality", modalities.get(self.modality).name)  # the alias "speech" -> "s2t"

  @property
  def config(self) -> str:
    """`demo-s2t-1024` (`mine-1a2b3c4d-s2t-1024` for a YAML spec; `demo-s2t-auto` for rows whose length the build
    chose from its items); variants that change the rows say so: `-noshare`, `-zhquirk`, `-truncate`, `-utterance`,
    `-joint`."""
    return self._config(spec_label(self.spec))

  def _config(self, label: str) -> str:
    return f"{label}-{self.modality}-{self.row_length or 'auto'}{self.variants.suffix}"

  @property
  def label(self) -> Label:
    """What it is scored as, in file names and keys: `s2s`, or `s2s_utterance` for the other protocol."""
    return Label(self.modality, self.variants.protocol)

  def record(self) -> dict:
    """What the build is, as it records it (`BuildMetadata.build`) and as a reader asks for it."""
    return {"task": self.task, "config": self.config, "spec": spec_label(self.spec), "modality": self.modality,
            "row_length": self.row_length, **dataclasses.asdict(self.variants)}

  def resolve(self) -> BuildPlan:
    """The selector with its spec loaded (once) and what follows from it."""
    spec = load_spec(self.spec)
    return BuildPlan(self, spec, self._config(spec_label(self.spec, spec)))


@dataclasses.dataclass(frozen=True)
class BuildPlan:
  """One build resolved: its selector, the spec as loaded and the config name, and from them the modality, the
  input format (s2sjax/data/formats) and the rows' capacity. Made once per build (`DataSelector.resolve`) and handed to
  the builder, its encoder and its metadata, which read no spec file again."""

  selector: DataSelector
  spec: Spec
  config: str  # the selector's config name

  @property
  def task(self) -> str:
    return self.selector.task

  @property
  def modality(self) -> Modality:
    return modalities.get(self.selector.modality)

  @property
  def variants(self) -> Variants:
    return self.selector.variants

  @property
  def input_format(self) -> formats.InputFormat:
    return self.spec.input_format

  @property
  def row_format(self) -> RowFormat:
    return self.input_format.row_format

  def for_task(self, task: str) -> BuildPlan:
    """The same build of another task (a TFDS config is shared by every task's builder)."""
    return dataclasses.replace(self, selector=dataclasses.replace(self.selector, task=task))

  def check(self) -> None:
    """Refuses, by name, what the spec cannot be asked (`Spec.check_modality`), before anything is loaded."""
    self.spec.check_modality(self.modality)

  @property
  def capacity(self) -> RowShape:
    """The rows' room before the build fits its tables to what they hold (packing.fit): for a build without a row
    length, the longest row allowed. Spoken candidates run to hundreds of units (a whole story, in the utterance
    protocol): any token may be scored."""
    shape = RowShape.for_length(self.selector.row_length or AUTO_MAX_LENGTH,
                                self.input_format.num_codebooks(self.spec, self.modality))
    return dataclasses.replace(shape, max_targets=shape.length) if self.modality.candidate == SPEECH else shape

  @property
  def widths(self) -> dict[str, int]:
    """The size of each named width of the rows' fields."""
    return self.input_format.widths(self.spec, self.modality)


def selectors(tasks: list[str] | tuple[str, ...], modality_names: list[str] | tuple[str, ...],
              protocols: list[str] | tuple[str, ...] = ("s2sbench",), spec: str = "demo",
              row_length: int | None = AUTO, variants: Variants = Variants()) -> list[DataSelector]:
  """The builds of every task x modality: every protocol asked that scores the modality (s2sbench's where none
  does); the tokenization for T->T and `separate` for the rest (a modality with speech has no joint string)."""
  def scoring(modality: str) -> list[str]:
    asked = [p for p in protocols if PROTOCOLS.get(p).modalities is None or modality in PROTOCOLS.get(p).modalities]
    return asked or [modalities.DEFAULT_PROTOCOL]

  return [DataSelector(task, modality, spec, row_length, dataclasses.replace(
            variants, protocol=protocol, tokenization=variants.tokenization if modality == "t2t" else "separate"))
          for task in tasks for modality in modality_names for protocol in scoring(modality)]


def usage(doc: str) -> str:
  """A command's docstring with `--task=TASK|all` spelled out from the task registry (a plugin's tasks
  included): what its `--help` prints."""
  return doc.replace("--task=TASK|all", f"--task={'|'.join(task_registry.names())}|all", 1)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The flags that select builds, the same for `tasks.prepare` and `s2sjax.eval`."""
  flags.DEFINE_enum("task", "all", task_registry.names() + ["all"], "Benchmark task (all: every one there is).",
                    flag_values=flag_values)
  flags.DEFINE_string("spec", "demo", "Speech-LLM spec preset or YAML path the data is built with.",
                      flag_values=flag_values)
  flags.DEFINE_string("modality", "both", "Modalities, prefix->candidate: any of t2t, s2t, t2s, s2s, comma-separated, "
                      "or text (t2t), speech (s2t), both (t2t,s2t: S2SBench's pair), all.", flag_values=flag_values)
  flags.DEFINE_list("protocol", ["s2sbench"], "How S->S is built and scored: s2sbench (prefix + candidate, the "
                    "candidate's units), utterance (TWIST / SlamKit: the whole spoken story), or both, comma-separated.",
                    flag_values=flag_values)
  flags.DEFINE_integer("row_length", AUTO, "Packed row length (default: chosen from the items, the config named "
                       "<spec>-<modality>-auto; s2sjax.data.packing.auto_row_length).", lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_bool("share_prefix", True, "Lay each prefix once for all its candidates (False: the -noshare build).",
                    flag_values=flag_values)
  flags.DEFINE_bool("reference_language_quirk", False, "The -zhquirk build: zh templates for every task, as "
                    "S2SBench's code applies them.", flag_values=flag_values)
  flags.DEFINE_enum("overlong", "error", list(OVERLONG), "Items longer than the row: fail (naming them), or drop "
                    "prefix tokens from the left (counted; the -truncate build).", flag_values=flag_values)
  flags.DEFINE_enum("tokenization", "separate", list(TOKENIZATIONS), "T->T: tokenize prefix and candidate apart "
                    "(separate), or as S2SBench's reference does, first + last as one string with the tokens past the "
                    "prefix scored (joint).", flag_values=flag_values)


def variants_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> Variants:
  """The variants `define_flags`' flags ask for (the protocol is each S->S build's, `selectors`)."""
  f = flag_values
  return Variants(f.share_prefix, f.reference_language_quirk, f.overlong, tokenization=f.tokenization)


def from_flags(tasks: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[DataSelector]:
  """The builds `define_flags`' flags ask for, of `tasks` (the command resolves `--task=all` its own way)."""
  f = flag_values
  return selectors(tasks, modalities.parse(f.modality), tuple(f.protocol), f.spec, f.row_length,
                   variants_from_flags(f))


@dataclasses.dataclass(frozen=True)
class BuildMetadata:
  """What a build records beside its rows (`metadata.json`)."""

  task: str
  modality: str
  spec: Spec  # resolved, as the build used it (the evaluator needs no spec file)
  row_shape: RowShape  # as laid: the tables the rows use, the longest item (packing.fit)
  variants: Variants = Variants()
  source: str = ""  # the release directory the build read
  tokenizer: dict | None = None  # task_data.tokenizer_identity of the text tokenizer; None: a unit LM's data
  audio_tokenizer: dict | None = None  # its identity and fingerprint
  audio_ids: AudioIds | None = None  # the spec's special tokens resolved in the tokenizer
  inputs: dict | None = None  # a fingerprint of each input (tasks.prepare reuses a build of the same inputs only)
  report: dict = dataclasses.field(default_factory=dict)  # counts, packing, truncations, skipped questions
  questions: tuple[dict, ...] = ()  # the question table's records (s2sjax.data.questions.QuestionTable)
  build: dict | None = None  # DataSelector.record(): what the build is
  integrity: dict | None = None  # checksums of the rows and of the question table

  def to_json(self) -> dict:
    """The JSON layout builds have always had (variants at the top level)."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "variants"}
    return dict(fields, spec=self.spec.as_dict(), row_shape=dataclasses.asdict(self.row_shape),
                audio_ids=dataclasses.asdict(self.audio_ids) if self.audio_ids else None,
                questions=list(self.questions), **dataclasses.asdict(self.variants))

  @classmethod
  def from_json(cls, fields: dict, where: str) -> BuildMetadata:
    """Reads `to_json`'s layout; a field left out past the core four has its default. `where` names the
    file in errors."""
    missing = [key for key in ("task", "modality", "spec", "row_shape") if key not in fields]
    if missing:
      raise DataError(f"{where}: the build's metadata lacks {', '.join(missing)} (not a build of this project, or "
                       "damaged): rebuild it with tasks.prepare --overwrite")
    variant_keys = {f.name for f in dataclasses.fields(Variants)}
    known = {f.name for f in dataclasses.fields(cls)} | variant_keys
    kept = {key: value for key, value in fields.items() if key in known - variant_keys}
    audio_ids = fields.get("audio_ids")
    return cls(**dict(
      kept, spec=spec_from_dict(fields["spec"], where=f"{where} spec"), row_shape=RowShape(**fields["row_shape"]),
      variants=Variants(**{key: fields[key] for key in variant_keys if key in fields}),
      audio_ids=AudioIds(**audio_ids) if audio_ids else None, questions=tuple(fields.get("questions", ()))))
