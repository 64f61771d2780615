"""The four ways a question is put to a model, named prefix -> candidate: `t2t`, `s2t`, `t2s`, `s2s`.

S2SBench scores T->T (text prefix, text candidates) and S->T (spoken prefix, text candidates); the gap is the
intelligence degradation. T->S and S->S make the candidates spoken too: their scored tokens are audio units, as
TWIST and Moshi score spoken StoryCloze. Every command takes a list of names, or an alias: `text` (t2t),
`speech` (s2t), `both` (t2t, s2t: S2SBench's pair) and `all`.
"""

from __future__ import annotations

import dataclasses

from s2sjax.errors import UserError

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
  """A modality by name; the old one-word names (`text`, `speech`, in earlier output directories) still read."""
  name = ALIASES[name][0] if name in ("text", "speech") else name
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


def label(name: str, protocol: str = "s2sbench") -> str:
  """What a score is filed under: the modality, or `s2s_utterance` for S->S scored by the utterance protocol."""
  return name if protocol == "s2sbench" else f"{name}_{protocol}"


def canonical(scored_as: str) -> str:
  """A label as this version writes it (earlier output directories say `text`, `speech`)."""
  name, _, protocol = scored_as.partition("_")
  return label(get(name).name, protocol or "s2sbench")


def title(scored_as: str) -> str:
  """`S→T`, or `S→S (utterance)`."""
  name, _, protocol = scored_as.partition("_")
  return get(name).title + (f" ({protocol})" if protocol else "")


def order(scored_as: str) -> tuple[int, str]:
  """Sort key: the four modalities in their order, each protocol after its modality."""
  name, _, protocol = scored_as.partition("_")
  return NAMES.index(get(name).name), protocol
