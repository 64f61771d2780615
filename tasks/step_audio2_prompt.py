"""Step-Audio 2's request layout: a prompt as the Step-Audio2 wrapper lays it (stepfun-ai/Step-Audio2
`stepaudio2.py`, as vendored by XiaomiMiMo/MiMo-Audio-Eval d64df78 `slm_eval/models/src_step_audio/stepaudio2.py`:
`__call__` 14-58, `StepAudio2Base.apply_chat_template` 60-83, `StepAudio2.apply_chat_template` 94-127), as pure
functions of ids.

A prompt is a list of pieces, each tokenised on its own and the ids concatenated (:21-24):

  text    a string, tokenised by the release's tokenizer (its added tokens, <|BOT|> and the like, split out)
  ids     a list of ids, taken as they are (a `token` item; speech out as 151696 + code)
  audio   per 25 s chunk `<audio_start>` + `<audio_patch>` x rows + `<audio_end>` (:73-77), the rows the model
          overwrites with that chunk's adaptor output (`patch_rows` marks them)

The base template (Step-Audio-2-mini-Base, :60-83) lays the items as they come. The chat template (Step-Audio-2-mini,
:94-127) lays per message `<|BOT|>{role}\n` (a user is "human"), its content (a string, or items), then `<|EOT|>`
unless the message says eot False; a message without content is a turn's opening only (the generation prompt).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, Union

import numpy as np

from s2sjax.runtime.errors import UserError


class StepAudio2PromptError(UserError, ValueError):
  """A request Step-Audio 2's layout cannot lay: names the piece and what does not fit."""


# The release tokenizer's names of the ids the layout places itself.
TOKEN_NAMES = {"audio_start": "<audio_start>", "audio_end": "<audio_end>", "audio_patch": "<audio_patch>"}
BOT, EOT = "<|BOT|>", "<|EOT|>"
TTS_START = "<tts_start>"  # what the assistant's turn opens with before speech out (the wrapper's speech examples)
SYSTEM = "You are a helpful assistant."  # the wrapper's examples' system prompt


@dataclasses.dataclass(frozen=True)
class AudioIds:
  """The ids of the audio markers, looked up in the release tokenizer by name."""

  audio_start: int
  audio_end: int
  audio_patch: int

  @classmethod
  def from_tokens(cls, token_id: Callable[[str], int]) -> "AudioIds":
    return cls(**{field: int(token_id(name)) for field, name in TOKEN_NAMES.items()})


@dataclasses.dataclass(frozen=True)
class Audio:
  """One recording: the adaptor rows of each of its 25 s chunks (`tasks.audio.step_audio2.patch_count`)."""

  chunk_rows: tuple[int, ...]


Piece = Union[str, Sequence[int], Audio]


@dataclasses.dataclass(frozen=True)
class Message:
  """A chat message: its role, its content (a string, a list of pieces, or None: the turn's opening only) and
  whether `<|EOT|>` closes it."""

  role: str
  content: str | Sequence[Piece] | None
  eot: bool = True


def chat_pieces(messages: Sequence[Message]) -> list[Piece]:
  """StepAudio2.apply_chat_template (:94-127) as pieces."""
  pieces: list[Piece] = []
  for message in messages:
    role = "human" if message.role == "user" else message.role
    if isinstance(message.content, str):
      pieces.append(f"{BOT}{role}\n{message.content}" + (EOT if message.eot else ""))
    elif message.content is None:
      pieces.append(f"{BOT}{role}\n")
    else:
      pieces.append(f"{BOT}{role}\n")
      pieces += list(message.content)
      if message.eot:
        pieces.append(EOT)
  return pieces


@dataclasses.dataclass(frozen=True)
class Laid:
  """A laid request: ids [L] int64 and the rows the model overwrites with adaptor rows, bool [L]."""

  ids: np.ndarray
  continuous: np.ndarray

  def __len__(self) -> int:
    return len(self.ids)


def lay(pieces: Sequence[Piece], tokenize: Callable[[str], Sequence[int]], audio: AudioIds) -> Laid:
  """The ids of `pieces` (base template: the items as they come; chat: `chat_pieces`), each tokenised alone."""
  ids: list[int] = []
  continuous: list[bool] = []
  for piece in pieces:
    if isinstance(piece, Audio):
      for rows in piece.chunk_rows:
        if rows < 1:
          raise StepAudio2PromptError(f"an audio chunk of {rows} adaptor rows: the chunk is too short to encode")
        ids += [audio.audio_start] + [audio.audio_patch] * rows + [audio.audio_end]
        continuous += [False] + [True] * rows + [False]
      continue
    laid = [int(i) for i in (tokenize(piece) if isinstance(piece, str) else piece)]
    ids += laid
    continuous += [False] * len(laid)
  return Laid(np.asarray(ids, np.int64), np.asarray(continuous, bool))


def base_request(prefix: Sequence[Piece]) -> list[Piece]:
  """Step-Audio-2-mini-Base's prompt: the prefix's pieces as they come (:60-83); the candidate continues it."""
  return list(prefix)


def chat_request(prefix: Sequence[Piece], reply_opening: str | None = None) -> list[Piece]:
  """Step-Audio-2-mini's prompt: the system prompt, the user's turn holding the prefix's pieces, then the
  assistant's turn opened for the candidate (with `reply_opening` and no <|EOT|>, as the wrapper's speech-out
  example opens it with <tts_start>)."""
  assistant = Message("assistant", reply_opening, eot=False)
  return chat_pieces([Message("system", SYSTEM), Message("user", list(prefix)), assistant])
