"""MiMo-Audio's request layout: segments of text and audio laid in patches as upstream's `get_input_ids` lays them
(XiaomiMiMo/MiMo-Audio 691ce54, `src/mimo_audio/process_speechdata.py` InputSegment.to_input_id 48-149,
`src/mimo_audio/mimo_audio.py` preprocess_input 241-281 and get_input_ids 290-300), as pure functions of ids.

A patch is one position of the model: a text id and `group_size` frames of the K RVQ channels.

  text segment   one patch per token: the token (upstream puts it in the patch's first frame slot, -100 in the
                 others: the model reads slot 0 only, modeling_mimo_audio.py:340), every channel's empty id in
                 every frame (71-78)
  audio segment  the codes [frames, K], padded to a multiple of group_size by repeating the last frame
                 (mimo_audio.py:268-279), one patch per group_size frames with text <|empty|> (92-98), wrapped by a
                 <|sosp|> patch and an <|eosp|> patch of empty ids (99-138) unless `wrapped` is False

Laid as (text ids [T], codes [T, group_size, K]); the special ids are the release tokenizer's, by name.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from s2sjax.runtime.errors import UserError


class MimoPromptError(UserError, ValueError):
  """A request MiMo-Audio's layout cannot lay: names what does not fit."""


TOKEN_NAMES = {"sosp": "<|sosp|>", "eosp": "<|eosp|>", "empty": "<|empty|>"}  # mimo_audio.py:54-76


@dataclasses.dataclass(frozen=True)
class MimoLayout:
  """What laying a request needs: the special ids, each channel's empty code and the frames per patch."""

  sosp: int
  eosp: int
  empty: int
  empty_codes: tuple[int, ...]  # speech_zeroemb_idx, per channel
  group_size: int

  @classmethod
  def from_tokens(cls, token_id: Callable[[str], int], empty_codes: Sequence[int], group_size: int) -> "MimoLayout":
    return cls(**{field: int(token_id(name)) for field, name in TOKEN_NAMES.items()},
               empty_codes=tuple(int(c) for c in empty_codes), group_size=int(group_size))

  def _empty_patches(self, count: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(self.empty_codes, np.int32), (count, self.group_size, len(self.empty_codes)))

  def text(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """A text segment: one patch per token, its speech all empty ids."""
    ids = np.asarray(ids, np.int32).reshape(-1)
    return ids, self._empty_patches(len(ids)).copy()

  def audio(self, codes: np.ndarray, wrapped: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """An audio segment of codes [frames, K] (the LLM's channels): patches of group_size frames with text <|empty|>,
    the last frame repeated to fill the last patch; between a <|sosp|> and an <|eosp|> patch when `wrapped`."""
    codes = np.asarray(codes, np.int32)
    channels = len(self.empty_codes)
    if codes.ndim != 2 or codes.shape[1] != channels or not len(codes):
      raise MimoPromptError(f"an audio segment is codes [frames >= 1, {channels}]; got {codes.shape}")
    fill = -len(codes) % self.group_size
    codes = np.concatenate([codes, np.repeat(codes[-1:], fill, axis=0)])
    patches = codes.reshape(-1, self.group_size, channels)
    text = np.full(len(patches), self.empty, np.int32)
    if wrapped:
      text = np.concatenate([[self.sosp], text, [self.eosp]]).astype(np.int32)
      patches = np.concatenate([self._empty_patches(1), patches, self._empty_patches(1)])
    return text, patches


def join(*segments: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Segments one after another (get_input_ids' concatenation, mimo_audio.py:299)."""
  return (np.concatenate([t for t, _ in segments]).astype(np.int32),
          np.concatenate([c for _, c in segments]).astype(np.int32))


def input_ids(text: np.ndarray, codes: np.ndarray) -> np.ndarray:
  """Upstream's input_ids [1 + K, group_size * T] of a laid request: text in each patch's first slot and -100 in
  the others (insert_between, process_speechdata.py:32-43), channel k's frames in row 1 + k."""
  patches, group, channels = codes.shape
  row0 = np.full((patches, group), -100, np.int64)
  row0[:, 0] = text
  return np.concatenate([row0.reshape(1, -1), codes.transpose(2, 0, 1).reshape(channels, -1)]).astype(np.int64)
