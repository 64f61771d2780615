"""The speech-LLM spec: everything that differs between speech LLMs when their benchmark rows are built.

A spec is a small YAML (presets: `SPECS`, the package's `s2sjax/data/specs/*.yaml` and a plugin's own): how audio
enters the model (`audio_mode`, the name of a registered input format, s2sjax/data/formats: `none`; `extended_vocab`:
unit k is an ordinary token; `codebook_tables`: K codebooks summed at a placeholder token; `parallel_streams`: a
text stream and K codebook streams side by side, one step per audio frame; or a plugin's), which audio tokenizer
makes the units, the special tokens around audio, whether the model reads text at all (a unit LM does not), and
the prompt templates. The format checks what it asks of a spec and says which modalities it cannot be asked. Per
modality (s2sjax.data.modalities), the prefix, then the scored candidate:

  T->T: first + separator | candidate text                   (S2SBench's; separator " " in English, "" in Chinese)
  S->T: instruction + [start] units(first) [end] | candidate text        (S2SBench's; instruction per language)
  T->S: instruction + first + [start] | units(candidate)
  S->S: instruction + [start] units(first) | units(candidate)            (the audio runs on: one spoken story)
  S->S without text (unit LMs): [bos] units(first) | units(candidate)

A `chat` spec (an instruct model's own prompt: GLM-4-Voice-9B's web_demo.py l.83-105) puts the prefix in a user
turn instead, and the candidate is the assistant's reply:

  chat[speech or text] + [start] units(first) [end] or first + chat[reply] | candidate (text or units)

where chat[speech] / chat[text] open the turn for a spoken / written prefix (its system prompt and user marker,
after the tokenizer's own special tokens) and chat[reply] opens the reply; the instruction and separator are not
used.

A spoken candidate is scored on its units only, as a text one on its tokens; no end token is scored. The
`utterance` protocol (TWIST / SlamKit) scores the whole spoken story instead: [bos] | units(first + candidate).

Specs of `parallel_streams` have no templates: the streams of prefix and candidate are laid by the protocol of the
architecture the spec names (`architecture`: its protocol, s2sjax/data/formats/streams.py's `STREAM_PROTOCOLS`), audio
on the codebook streams, text on the text stream, -1 where a stream is silent, delayed per stream by `stream_delays`
when rows are built; a delayed stream opens with its initial token (`text_initial_id` for text, codebook k's size for
codebook k, as Kyutai's `LMModel._get_initial_token`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Mapping

import yaml

from s2sjax.data import formats
from s2sjax.data.formats.format import SpecError
from s2sjax.runtime.errors import UnknownNameError, UserError
from s2sjax.data.modalities import Modality
from s2sjax.runtime.registry import Registry
from s2sjax.data.rows import RowFormat

SPECS_DIR = os.path.join(os.path.dirname(__file__), "specs")
# Keys a spec sets only when it uses them (a format's own keys, chat turns, an architecture, format options): an
# unset one is no part of what the spec is, so it is left out of `as_dict` and so of the digest that names the
# data built with it.
UNSET_UNLESS_USED = ("stream_delays", "text_initial_id", "chat", "architecture", "options")
CHAT_KEYS = ("speech", "text", "reply")  # `chat`: what opens the user turn for each kind of prefix, then the reply

# S2SBench's s2t prompt (s2t_infer_ppl.py) and t2t separator (t2t_infer_ppl.py).
SPEECH_INSTRUCTION = {
  "en": "Below is a segment of alternating speech and text content: ",
  "zh": "下面是一段语音和文本交错的内容：",
}
TEXT_SEPARATOR = {"en": " ", "zh": ""}


@dataclasses.dataclass(frozen=True)
class Spec:
  name: str
  audio_mode: str
  audio_tokenizer: dict[str, Any]
  codebook_sizes: tuple[int, ...]
  start_token: str | None = None
  end_token: str | None = None
  placeholder_token: str | None = None  # codebook_tables
  # extended_vocab: format string of unit k's token, e.g. "<|audio_{}|>"; with several codebooks of code k and
  # codebook q, e.g. "<{}_{}>" (Llama-Mimi's `<{code}_{q}>`)
  unit_token: str | None = None
  unit_offset: int | None = None  # extended_vocab, one codebook: or unit k is id offset + k
  # False for unit LMs (TWIST, SLAM): no text tokenizer, no templates; only S->S can be asked of them.
  text_vocabulary: bool = True
  bos_id: int | None = None  # without a text vocabulary: the id that opens every sequence (SlamKit's 1)
  stream_delays: tuple[int, ...] | None = None  # streams: per stream (text, then each codebook) its delay
  text_initial_id: int | None = None  # streams: the text stream's initial token (the model's text vocabulary size)
  # The registered architecture that scores its rows (s2sjax/scoring/architectures), by name; a stream spec names one
  # (its protocol lays the streams: s2sjax/data/formats/streams.py); None: the first that reads the format's rows.
  architecture: str | None = None
  speech_instruction: dict[str, str] = dataclasses.field(default_factory=lambda: dict(SPEECH_INSTRUCTION))
  text_separator: dict[str, str] = dataclasses.field(default_factory=lambda: dict(TEXT_SEPARATOR))
  chat: dict[str, str] | None = None  # an instruct model's turns (CHAT_KEYS), in place of the templates above
  options: dict[str, Any] | None = None  # settings only the input format reads (its `check_spec` holds them)

  def __post_init__(self):
    try:
      input_format = formats.get(self.audio_mode)
    except UnknownNameError as e:
      raise SpecError(f"spec {self.name}: {e.args[0]}") from None
    if self.chat is not None and (set(self.chat) != set(CHAT_KEYS) or not self.text_vocabulary
                                  or not input_format.chat):
      raise SpecError(f"spec {self.name}: chat needs exactly the keys {', '.join(CHAT_KEYS)} (found "
                      f"{', '.join(sorted(self.chat))}), a text vocabulary and an audio_mode that lays chat turns")
    for key in (f.name for f in dataclasses.fields(self)):
      owner = formats.owner_of_key(key)
      if getattr(self, key) is not None and owner is not None and owner is not input_format:
        raise SpecError(f"spec {self.name}: {' and '.join(owner.spec_keys)} are set exactly when audio_mode is "
                        f"{owner.name}")
    problems = input_format.check_spec(self)
    if problems:
      raise SpecError("; ".join(problems))
    if input_format.takes_audio and not self.audio_tokenizer.get("type"):
      raise SpecError(f"spec {self.name}: audio_tokenizer.type is required with audio_mode {self.audio_mode}")

  @property
  def input_format(self) -> formats.InputFormat:
    """How its model takes audio: the format its `audio_mode` names (s2sjax/data/formats)."""
    return formats.get(self.audio_mode)

  @property
  def has_speech(self) -> bool:
    return self.input_format.takes_audio

  def check_modality(self, modality: Modality) -> None:
    """Refuses, by name, a modality this spec's model cannot be asked."""
    if modality.speaks and not self.has_speech:
      raise SpecError(f"spec {self.name} is text-only: it has no audio units for {modality.name} ({modality.title})")
    if modality.reads_text and not self.text_vocabulary:
      raise SpecError(f"spec {self.name} is a unit LM without a text vocabulary: only s2s (S→S) can be asked of "
                      f"it, not {modality.name} ({modality.title})")
    refused = self.input_format.refuse(self, modality)
    if refused:
      raise SpecError(refused)

  def stream_protocol(self) -> formats.streams.StreamProtocol:
    """How a question is laid on this stream spec's streams: the protocol of the architecture it names."""
    try:
      return formats.streams.STREAM_PROTOCOLS.get(self.architecture)
    except UnknownNameError as e:
      raise SpecError(f"spec {self.name}: {e.args[0]}") from None

  @property
  def row_format(self) -> RowFormat:
    """The rows a build of this spec packs: its input format's."""
    return self.input_format.row_format

  @property
  def num_streams(self) -> int:
    """streams: the text stream and one per codebook."""
    return 1 + len(self.codebook_sizes)

  @property
  def stream_initial_ids(self) -> tuple[int, ...]:
    """streams: each stream's initial token: text_initial_id, then each codebook's size."""
    return (self.text_initial_id,) + tuple(self.codebook_sizes)

  def as_dict(self) -> dict:
    """The fields, less those left unset that a spec sets only when it uses them (`UNSET_UNLESS_USED`)."""
    return {k: v for k, v in dataclasses.asdict(self).items() if not (k in UNSET_UNLESS_USED and v is None)}

  def digest(self) -> str:
    """A hash of the resolved contents (defaults filled in), so the same spec hashes alike from any file."""
    return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def is_spec_path(name_or_path: str) -> bool:
  return name_or_path.endswith((".yaml", ".yml"))


@dataclasses.dataclass(frozen=True)
class SpecFile:
  """A preset read from its YAML when asked for. A relative `path` is one of the package's own, read from
  `SPECS_DIR` at that moment; a plugin gives its file's absolute path."""

  name: str
  path: str


def _no_spec(name: str, presets: list[str]) -> str:
  return f"no spec {name!r}: presets are {', '.join(presets)}, or give a .yaml path"


def _preset_problems(preset: Spec | SpecFile, registered: Mapping[str, Spec | SpecFile]) -> list[str]:
  """A preset's name is `--spec=NAME` and the first part of its data's config names (s2sjax.data.task_data)."""
  problems = []
  if not re.fullmatch(r"[A-Za-z0-9_.]+", preset.name) or is_spec_path(preset.name):
    problems.append("a preset's name is letters, digits, '_' and '.', and does not end in .yaml")
  if isinstance(preset, SpecFile) and not os.path.isfile(os.path.join(SPECS_DIR, preset.path)):
    problems.append(f"its file {preset.path} does not exist")
  return problems


# A plugin adds a preset with `register(SpecFile(name, yaml_path))` or `register(Spec(...))`; `--spec=NAME` then
# finds it.
SPECS: Registry[Spec | SpecFile] = Registry("spec", check=_preset_problems, unknown=_no_spec,
                                            error=SpecError)
register = SPECS.register
# The package's presets, one per YAML file, named after it.
PRESETS = tuple(sorted(f[: -len(".yaml")] for f in os.listdir(SPECS_DIR) if f.endswith(".yaml")))
for _name in PRESETS:
  register(SpecFile(_name, f"{_name}.yaml"))


def available_specs() -> list[str]:
  """The package's presets: each is a default builder config of every task (tasks/tfds_builder.py, which reads
  this while it is imported, before any plugin is). A plugin's presets are listed by `SPECS.names()`."""
  return list(PRESETS)


def load_spec(name_or_path: str) -> Spec:
  """A registered preset by name (the package's, see `available_specs()`, or a plugin's) or a YAML file path."""
  if is_spec_path(name_or_path):
    if not os.path.exists(name_or_path):
      raise _no_spec(name_or_path, SPECS.names())
    return _read_spec(name_or_path)
  preset = SPECS.get(name_or_path)
  if isinstance(preset, Spec):
    return preset
  spec = _read_spec(os.path.join(SPECS_DIR, preset.path))
  if spec.name != preset.name:
    raise SpecError(f"spec preset {preset.name!r} ({preset.path}) is named {spec.name!r} inside: the data built "
                    "with it would carry two names")
  return spec


def _read_spec(path: str) -> Spec:
  with open(path, encoding="utf-8") as f:
    return spec_from_dict(yaml.safe_load(f) or {}, where=path)


def spec_from_dict(fields: dict, where: str = "spec") -> Spec:
  """A spec from its YAML or JSON form (a built dataset's metadata holds `as_dict()`), defaults filled in."""
  fields = dict(fields)
  fields.setdefault("audio_tokenizer", {})
  fields["codebook_sizes"] = tuple(fields.get("codebook_sizes") or ())
  if fields.get("stream_delays") is not None:
    fields["stream_delays"] = tuple(fields["stream_delays"])
  for key in ("speech_instruction", "text_separator"):
    fields[key] = {**(SPEECH_INSTRUCTION if key == "speech_instruction" else TEXT_SEPARATOR), **fields.get(key, {})}
  unknown = set(fields) - {f.name for f in dataclasses.fields(Spec)}
  if unknown:
    raise SpecError(f"{where}: unknown keys {sorted(unknown)}")
  missing = [k for k in ("name", "audio_mode") if not fields.get(k)]
  if missing:
    raise SpecError(f"{where}: missing keys {missing}")
  return Spec(**fields)


def id_ranges(ids) -> str:
  """A list of ids as runs: `49152..49407` (256 ids), `3, 7..9`."""
  ids = sorted(ids)
  runs, start = [], 0
  for i in range(1, len(ids) + 1):
    if i == len(ids) or ids[i] != ids[i - 1] + 1:
      runs.append(str(ids[start]) if start == i - 1 else f"{ids[start]}..{ids[i - 1]}")
      start = i
  return ", ".join(runs) + (f" ({len(ids)} ids)" if len(ids) > 2 else "")


@dataclasses.dataclass(frozen=True)
class AudioIds:
  """The spec's special tokens resolved against one text tokenizer."""

  start: int | None
  end: int | None
  placeholder: int | None
  # extended_vocab: token id of each unit, codebook after codebook (codebook 0's codes, then codebook 1's, ...)
  unit_ids: list[int] | None


def resolve_audio_ids(spec: Spec, tokenizer) -> AudioIds:
  """Looks every special token of the spec up in the tokenizer; a token it lacks is an error, not a guess. A spec
  without a text vocabulary has no tokenizer (None): its units are ids from `unit_offset`."""
  if not spec.text_vocabulary:
    return AudioIds(None, None, None, list(range(spec.unit_offset, spec.unit_offset + spec.codebook_sizes[0])))
  vocab = tokenizer.get_vocab()

  def lookup(token: str | None, role: str) -> int | None:
    if token is None:
      return None
    if token not in vocab:
      raise SpecError(f"spec {spec.name}: {role} {token!r} is not in the tokenizer's vocabulary")
    return int(vocab[token])

  unit_ids = None
  if spec.audio_mode == "extended_vocab":
    units = spec.codebook_sizes[0]
    if spec.unit_token is not None:
      unit_ids = [lookup(spec.unit_token.format(k, q), "unit token") for q, size in enumerate(spec.codebook_sizes)
                  for k in range(size)]
    else:
      # Units are ids the tokenizer has, or ids past its end (rows the model added); never both, which would
      # make some units text tokens. Ids past the model's own table are refused when scoring.
      size, end = len(tokenizer), spec.unit_offset + units
      if spec.unit_offset < 0 or spec.unit_offset < size < end:
        raise SpecError(f"spec {spec.name}: units {spec.unit_offset}..{end - 1} straddle the end of the "
                        f"tokenizer's {size} tokens: some would be text tokens")
      unit_ids = list(range(spec.unit_offset, spec.unit_offset + units))
  return AudioIds(lookup(spec.start_token, "start_token"), lookup(spec.end_token, "end_token"),
                  lookup(spec.placeholder_token, "placeholder_token"), unit_ids)
