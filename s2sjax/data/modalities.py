"""The four ways a question is put to a model, named prefix -> candidate: `t2t`, `s2t`, `t2s`, `s2s`.

S2SBench scores T->T (text prefix, text candidates) and S->T (spoken prefix, text candidates); the gap is the
intelligence degradation. T->S and S->S make the candidates spoken too: their scored tokens are audio units, as
TWIST and Moshi score spoken StoryCloze. Every command takes a list of names, or an alias: `text` (t2t),
`speech` (s2t), `both` (t2t, s2t: S2SBench's pair) and `all`.
"""

from __future__ import annotations

import dataclasses

from s2sjax.runtime.errors import UserError

TEXT, SPEECH = "text", "speech"


class ModalityError(UserError, ValueError):
  """A --modality value (or a scores file's name) that names no modality."""


@dataclasses.dataclass(frozen=True)
class Modality:
  name: str  # "s2t"
  prefix: str  # TEXT or SPEECH
  candidate: str  # TEXT or SPEECH

  @property
  def title(self) -> str:
    """The paper's notation: S→T."""
    return f"{self.prefix[0].upper()}→{self.candidate[0].upper()}"

  @property
  def speaks(self) -> bool:
    """Audio on either side: the data needs an audio tokenizer, the spec audio units."""
    return SPEECH in (self.prefix, self.candidate)

  @property
  def reads_text(self) -> bool:
    """Text on either side: a spec without a text vocabulary (a unit LM) cannot be asked this."""
    return TEXT in (self.prefix, self.candidate)


MODALITIES = {m.name: m for m in (
  Modality("t2t", TEXT, TEXT), Modality("s2t", SPEECH, TEXT), Modality("t2s", TEXT, SPEECH),
  Modality("s2s", SPEECH, SPEECH))}
NAMES = tuple(MODALITIES)
ALIASES = {"text": ("t2t",), "speech": ("s2t",), "both": ("t2t", "s2t"), "all": NAMES}
# The degradation matrix: each modality that brings in speech against the all-text one, and the spoken
# continuation against the spoken prefix with text candidates.
COMPARISONS = (("t2t", "s2t"), ("t2t", "t2s"), ("t2t", "s2s"), ("s2t", "s2s"))


def get(name: str) -> Modality:
  """A modality by its name, or by an alias that names one (`text`, `speech`, as --modality takes them)."""
  name = ALIASES[name][0] if name in ALIASES and len(ALIASES[name]) == 1 else name
  if name not in MODALITIES:
    raise ModalityError(f"unknown modality {name!r}: one of {', '.join(NAMES)} (or {', '.join(ALIASES)})")
  return MODALITIES[name]


def parse(value: str) -> tuple[str, ...]:
  """`--modality`: comma-separated names or aliases, in the order given, each once (`s2s,both` -> s2s, t2t, s2t)."""
  names: list[str] = []
  for part in filter(None, (p.strip() for p in value.split(","))):
    for name in ALIASES[part] if part in ALIASES else (get(part).name,):
      if name not in names:
        names.append(name)
  if not names:
    raise ModalityError(f"--modality {value!r} names no modality")
  return tuple(names)


def comparison_key(reference: str, other: str) -> str:
  """How the degradation of `other` against `reference` is keyed in metrics.json: `s2t_vs_t2t`."""
  return f"{other}_vs_{reference}"


DEFAULT_PROTOCOL = "s2sbench"  # S2SBench's: prefix + candidate, the candidate's tokens scored (s2sjax.data.builds.PROTOCOLS)


class Label(str):
  """What a score is filed under: the modality, or `s2s_utterance` for S->S scored by another protocol. A string
  (file names, metrics.json keys) that carries its modality and protocol: made from them once, read back from a
  key only where a file names it (`from_key`)."""

  modality: Modality
  protocol: str

  def __new__(cls, modality: Modality | str, protocol: str = DEFAULT_PROTOCOL) -> "Label":
    modality = get(modality) if isinstance(modality, str) else modality
    label = super().__new__(cls, modality.name if protocol == DEFAULT_PROTOCOL else f"{modality.name}_{protocol}")
    label.modality, label.protocol = modality, protocol
    return label

  def __getnewargs__(self):
    return self.modality.name, self.protocol

  @classmethod
  def from_key(cls, key: str) -> "Label":
    """The label a scores file's or metrics.json's key names (`s2t`, `s2s_utterance`)."""
    if isinstance(key, Label):
      return key
    for name in NAMES:
      if key == name or key.startswith(f"{name}_"):
        return cls(MODALITIES[name], key[len(name) + 1:] or DEFAULT_PROTOCOL)
    raise ModalityError(f"{key!r} names no modality: one of {', '.join(NAMES)}, or one followed by _<protocol>")

  @property
  def title(self) -> str:
    """`S→T`, or `S→S (utterance)`."""
    return self.modality.title + (f" ({self.protocol})" if self.protocol != DEFAULT_PROTOCOL else "")

  @property
  def order(self) -> tuple[int, str]:
    """Sort key: the four modalities in their order, each protocol after its modality."""
    return NAMES.index(self.modality.name), "" if self.protocol == DEFAULT_PROTOCOL else self.protocol


def scored_as(name: str, labels: list[str]) -> str | None:
  """Which of a task's score labels stands for the modality `name` in the degradation matrix: its default
  protocol's, else the one other protocol it was scored by (a release that asks S->S under the utterance protocol
  only); None when neither."""
  of_modality = [label for label in labels if Label.from_key(label).modality.name == name]
  if name in of_modality:
    return next(label for label in of_modality if label == name)
  return of_modality[0] if len(of_modality) == 1 else None


def title(label: str) -> str:
  """A label's title, from the label or from the key a file gives it."""
  return Label.from_key(label).title


def order(label: str) -> tuple[int, str]:
  """A label's sort key, from the label or from the key a file gives it."""
  return Label.from_key(label).order
