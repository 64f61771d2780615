"""What a way of taking audio declares, and where the ways are found: `InputFormat` records in `INPUT_FORMATS`, a
`s2sjax.runtime.registry.Registry` keyed by the spec's `audio_mode`, as families, tasks and architectures are.

An input format is everything that differs between the ways a model reads a question (seqio's feature converter with
its features): the rows it lays (a `rows.RowFormat`, typed fields), what it asks of a spec and which modalities it
cannot be asked, the widths of its rows, and how the pre-flight (`s2sjax.check`) makes a row's audio uninformative;
the build stage registers the encoder that lays its rows under its name (tasks/encoders.py). The spec
(s2sjax/data/spec.py), the builder, the TFDS features, the task data and the pre-flight look a format up here and
never branch on an audio mode.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from s2sjax.runtime.errors import UserError
from s2sjax.data.modalities import Modality
from s2sjax.runtime.registry import Registry
from s2sjax.data.rows import RowFormat

Spec = Any  # s2sjax.data.spec.Spec (which looks formats up: typed loosely here to keep the import one way)


class SpecError(UserError, ValueError):
  """A spec that is malformed or does not fit the tokenizer (defined with the formats, whose rules raise it too)."""


def _nothing(*args) -> None:
  return None


def _no_problems(spec: Spec) -> list[str]:
  return []


def _no_codebooks(spec: Spec, modality: Modality) -> int:
  return 0


def _no_widths(spec: Spec, modality: Modality) -> dict[str, int]:
  return {}


@dataclasses.dataclass(frozen=True)
class InputFormat:
  """One way a model takes a question, named by the spec's `audio_mode`.

  The build's encoders that lay its rows are registered under its name by the build stage (tasks/encoders.py,
  `ENCODERS`). `spec_keys` are `Spec` fields only specs
  of this format set (refused on any other); `check_spec(spec)` lists what the format asks of a spec that it lacks;
  `refuse(spec, modality)` says why a spec of this format cannot be asked a modality (None: it can).
  `num_codebooks(spec, modality)` is the K of the rows' `packing.RowShape`; `widths(spec, modality)` the size of
  each named width of `row_format`'s fields. `blank_audio(rows, metadata)` is the rows with their audio made
  uninformative (None: nothing to blank), so the pre-flight can tell that the audio reaches the model."""

  name: str
  row_format: RowFormat
  takes_audio: bool = True  # False: a text-only spec, which no spoken modality can be asked of
  chat: bool = False  # its encoder lays a spec's `chat` turns (an instruct model's prompt)
  spec_keys: tuple[str, ...] = ()
  check_spec: Callable[[Spec], list[str]] = _no_problems
  refuse: Callable[[Spec, Modality], str | None] = _nothing
  num_codebooks: Callable[[Spec, Modality], int] = _no_codebooks
  widths: Callable[[Spec, Modality], dict[str, int]] = _no_widths
  blank_audio: Callable[[Mapping[str, np.ndarray], Any], dict[str, np.ndarray] | None] = _nothing


def _problems(new: InputFormat, registered: Mapping[str, InputFormat]) -> list[str]:
  owned = {key: f.name for f in registered.values() for key in f.spec_keys}
  return [f"spec key {key!r} is {owned[key]}'s already" for key in new.spec_keys if key in owned]


INPUT_FORMATS: Registry[InputFormat] = Registry(
  "input format", check=_problems, unknown=lambda name, known: f"audio_mode {name!r} is not one of {', '.join(known)}")
register = INPUT_FORMATS.register
get = INPUT_FORMATS.get


def owner_of_key(key: str) -> InputFormat | None:
  """The registered format whose specs alone set `key` (a `Spec` field), if any (formats register before the
  specs that name them)."""
  return next((f for f in INPUT_FORMATS.registered() if key in f.spec_keys), None)


# Spec fields of the token formats that a format laying its tokenizer's own markers (Kimi-Audio's, MiMo-Audio's)
# does not read.
TOKEN_KEYS = ("start_token", "end_token", "placeholder_token", "unit_token", "unit_offset", "bos_id", "chat")


def own_layout_problems(spec: Spec, options: tuple[str, ...], minimum: int) -> list[str]:
  """What a spec of such a format lacks: exactly the integer `options` (each at least `minimum`), and none of the
  TOKEN_KEYS."""
  given = spec.options or {}
  problems = []
  if sorted(given) != sorted(options) or not all(isinstance(v, int) and v >= minimum for v in given.values()):
    kind = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
    problems.append(f"options needs exactly the {kind} integers {', '.join(options)} (found {given or 'none'})")
  return problems + [f"no {key} (its markers are the tokenizer's own)" for key in TOKEN_KEYS
                     if getattr(spec, key) is not None]
