"""Kimi-Audio's message layout: a request as upstream's prompt manager lays it (MoonshotAI/Kimi-Audio 349251e,
`kimia_infer/api/prompt_manager.py` tokenize_message 78-168, get_prompt 170-240; `kimia_infer/utils/data.py`
KimiAContent), as pure functions of ids.

A request is two id streams of equal length, audio and text, and the continuous mask (the rows whose Whisper feature
is mixed in). Per message of a turn:

  role token     when the role changes (93-103): audio = kimia_user_msg_start / kimia_assistant_msg_start, text BLANK
  text message   (105-116) text = its ids, audio = BLANK each; an assistant's then text = kimia_text_eos, audio BLANK
  audio message  (118-143) audio = media_begin, the codes + kimia_token_offset (continuous), media_end; text BLANK;
                 then, where the message ends the turn, audio = kimia_speech_ct_id (output type text; ctd for both)
  turn end       (160-162) where the next message has another role, or none follows: audio = msg_end, text BLANK
                 (a text message ending a turn gets msg_end and no ct token)

then the assistant's start (222-233): audio = kimia_assistant_msg_start, text BLANK. A scored text continuation is
the assistant's text message after that start: text = the candidate's ids, audio = kimia_text_blank each
(kimia.py:143-147 forces the audio stream to BLANK while text is generated; 180-192 feed (BLANK, sampled id)).

Upstream runs one audio message per sequence: its feature loop indexes the features by the batch row of each
media_begin (modeling_kimia.py:688-698) and asserts the segment's length against the whole row's mask, so a second
audio message fails there; the layout refuses it. The special ids come from the release's text tokenizer
(`KimiSpecialIds.from_tokens`, special_tokens.py:25-45); the model places features between the config's
media_begin and media_end (modeling_kimia.py:678-698), which the evaluator holds the rows' markers to.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from s2sjax.runtime.errors import UserError


class KimiPromptError(UserError, ValueError):
  """A request Kimi-Audio's layout cannot lay: names the message and what does not fit."""


# special_tokens.py:33-43: the tokenizer's names of the ids the layout uses.
TOKEN_NAMES = {
  "msg_end": "<|im_msg_end|>", "media_begin": "<|im_media_begin|>", "media_end": "<|im_media_end|>",
  "text_blank": "<|im_kimia_text_blank|>", "text_eos": "<|im_kimia_text_eos|>",
  "user_start": "<|im_kimia_user_msg_start|>", "assistant_start": "<|im_kimia_assistant_msg_start|>",
  "speech_ct": "<|im_kimia_speech_ct_id|>", "speech_ctd": "<|im_kimia_speech_ctd_id|>",
}
OUTPUT_TYPES = ("text", "both")  # get_prompt's output_type (180): the ct token after the user's audio says which


@dataclasses.dataclass(frozen=True)
class KimiSpecialIds:
  """The special ids of the layout (upstream's `ExtraTokens`, the kimia_ ones and the message markers)."""

  msg_end: int
  media_begin: int
  media_end: int
  text_blank: int
  text_eos: int
  user_start: int
  assistant_start: int
  speech_ct: int
  speech_ctd: int

  @classmethod
  def from_tokens(cls, token_id: Callable[[str], int]) -> "KimiSpecialIds":
    """From a tokenizer's token -> id lookup (its `special_tokens[name]` or `convert_tokens_to_ids`)."""
    return cls(**{field: int(token_id(name)) for field, name in TOKEN_NAMES.items()})


@dataclasses.dataclass(frozen=True)
class Message:
  """One message of a request: its role and either text ids or GLM-4-Voice codes (before the offset)."""

  role: str  # "user" | "assistant"
  text: Sequence[int] | None = None
  codes: Sequence[int] | None = None

  def __post_init__(self):
    if self.role not in ("user", "assistant"):
      raise KimiPromptError(f"message role {self.role!r}: Kimi-Audio's prompt has user and assistant messages")
    if (self.text is None) == (self.codes is None):
      raise KimiPromptError("a message holds text ids or audio codes, one of the two")


@dataclasses.dataclass(frozen=True)
class KimiStreams:
  """A request's rows: audio and text ids [L] int64, continuous [L] bool (where a code's Whisper feature enters)."""

  audio: np.ndarray
  text: np.ndarray
  continuous: np.ndarray

  def __len__(self) -> int:
    return len(self.audio)

  @classmethod
  def of(cls, rows: Sequence[tuple[int, int, bool]]) -> "KimiStreams":
    audio, text, continuous = (np.asarray(column) for column in zip(*rows)) if rows else ([], [], [])
    return cls(np.asarray(audio, np.int64), np.asarray(text, np.int64), np.asarray(continuous, bool))

  def then(self, other: "KimiStreams") -> "KimiStreams":
    return KimiStreams(np.concatenate([self.audio, other.audio]), np.concatenate([self.text, other.text]),
                       np.concatenate([self.continuous, other.continuous]))


def _message_rows(message: Message, special: KimiSpecialIds, token_offset: int, num_codes: int, opens_turn: bool,
                  ends_turn: bool, output_type: str) -> list[tuple[int, int, bool]]:
  blank = special.text_blank
  rows = []
  if opens_turn:
    rows.append((special.user_start if message.role == "user" else special.assistant_start, blank, False))
  if message.text is not None:
    rows += [(blank, int(token), False) for token in message.text]
    if message.role == "assistant":
      rows.append((blank, special.text_eos, False))
  else:
    codes = np.asarray(message.codes, np.int64)
    outside = np.flatnonzero((codes < 0) | (codes >= num_codes))
    if len(outside):
      raise KimiPromptError(f"audio code {codes[outside[0]]} at {outside[0]} is outside the model's {num_codes} "
                            "GLM-4-Voice codes")
    rows.append((special.media_begin, blank, False))
    rows += [(int(code) + token_offset, blank, True) for code in codes]
    rows.append((special.media_end, blank, False))
    if ends_turn:
      rows.append((special.speech_ct if output_type == "text" else special.speech_ctd, blank, False))
  if ends_turn:
    rows.append((special.msg_end, blank, False))
  return rows


def lay_prompt(messages: Sequence[Message], special: KimiSpecialIds, token_offset: int, num_codes: int,
               output_type: str = "text", assistant_start: bool = True) -> KimiStreams:
  """`get_prompt(messages, output_type, add_assistant_start_msg=assistant_start)` as ids (module docstring)."""
  if output_type not in OUTPUT_TYPES:
    raise KimiPromptError(f"output_type {output_type!r} is not one of {OUTPUT_TYPES}")
  if sum(m.codes is not None for m in messages) > 1:
    raise KimiPromptError("Kimi-Audio reads one audio message per sequence (modeling_kimia.py:688-698)")
  rows = []
  for i, message in enumerate(messages):
    opens_turn = i == 0 or messages[i - 1].role != message.role
    ends_turn = i == len(messages) - 1 or messages[i + 1].role != message.role
    rows += _message_rows(message, special, token_offset, num_codes, opens_turn, ends_turn, output_type)
  if assistant_start:
    rows.append((special.assistant_start, special.text_blank, False))
  return KimiStreams.of(rows)


def lay_text_continuation(candidate: Sequence[int], special: KimiSpecialIds) -> KimiStreams:
  """A scored text candidate after the assistant's start: text = its ids, audio = BLANK each."""
  return KimiStreams.of([(special.text_blank, int(token), False) for token in candidate])


def lay_request(candidate: Sequence[int], special: KimiSpecialIds, token_offset: int, num_codes: int, *,
                codes: Sequence[int] | None = None, text: Sequence[int] | None = None,
                instruction: Sequence[int] | None = None) -> tuple[KimiStreams, int]:
  """(rows, prefix length) of a scored text candidate after the user's turn: the instruction's text message where
  one is given, then the prefix, its audio codes (S->T) or its text ids (T->T); the assistant's start; the
  candidate's text."""
  messages = [Message("user", text=instruction)] if instruction is not None else []
  messages.append(Message("user", codes=codes, text=text))
  prefix = lay_prompt(messages, special, token_offset, num_codes)
  return prefix.then(lay_text_continuation(candidate, special)), len(prefix)


def lay_features(streams: KimiStreams, features: np.ndarray) -> np.ndarray:
  """float32 [L, F]: the audio message's Whisper features [T, F] at the continuous rows, in order (the first T
  features, as modeling_kimia.py:693-698 reads them), zeros elsewhere."""
  rows = np.flatnonzero(streams.continuous)
  features = np.asarray(features, np.float32)
  if features.ndim != 2 or len(features) < len(rows):
    raise KimiPromptError(f"{len(rows)} code rows need as many feature rows; got features of shape {features.shape}")
  out = np.zeros((len(streams), features.shape[1]), np.float32)
  out[rows] = features[: len(rows)]
  return out
