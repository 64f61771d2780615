"""The parallel-stream input format (`parallel_streams`) and its packer: a text stream and K codebook streams read
side by side, one step per audio frame, in stream rows (s2sjax/data/rows.py's STREAM_ROWS), laid by the protocol of the
architecture a stream spec names (`STREAM_PROTOCOLS`, keyed by that name: Moshi's, `moshi_protocol.py`, or a
plugin's). The protocol is the data's side of the model: which streams a modality scores and how a side of a
question is laid, so the build reads it here and imports no model code.

Per position S = 1 + K stream ids (text first) in delayed step space, positions being step indices; per target the
position whose temporal output predicts a step, that predicted step's tokens [M, S] (`target_frame`: a depth model
reads its earlier streams) and the weight of each stream's token in the score [M, S] (`target_weight`, 0: not
scored); one target per predicted step.

Delays are applied here, once, when an item's rows are built (`delay_streams`): a candidate's steps then hold the
tail of the prefix's delayed streams, so they are built from prefix + candidate together; a delayed stream's token
is scored with the candidate it belongs to (its time, not its step, is the candidate's). Rows may carry only the
first S streams a model reads (the text and the model's own codebooks, as a spec lays them): the model's scorer
reads the streams past them as silence.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from s2sjax.data.formats.format import InputFormat, register
from s2sjax.runtime.registry import Registry
from s2sjax.data.modalities import SPEECH
from s2sjax.data.packing import LaidItem, PackingError, PackReport, RowShape, fits_shared, item_name, pack_laid
from s2sjax.data.rows import STREAM_ROWS

NAME = "parallel_streams"
SPEC_KEYS = ("stream_delays", "text_initial_id")  # what only stream specs set: each stream's delay, text's initial id
# What a stream spec does not take: its audio rides on streams of its own, not on tokens of a text vocabulary.
TOKEN_KEYS = ("start_token", "end_token", "placeholder_token", "unit_token", "unit_offset", "bos_id")


def delay_streams(streams: np.ndarray, delays: Sequence[int], initial_ids: Sequence[int]) -> np.ndarray:
  """Kyutai's `LMModel._delay_sequence` with its initial step: time-aligned streams [T, S] -> steps [T + 1, S],
  where step 0 is every stream's initial token and step s + 1 of stream k holds streams[s - delays[k], k] (the
  initial token while s < delays[k])."""
  streams = np.asarray(streams)
  if streams.ndim != 2 or streams.shape[1] != len(delays) or len(initial_ids) != len(delays):
    raise PackingError(f"streams {streams.shape} do not match {len(delays)} delays and {len(initial_ids)} initial ids")
  length = streams.shape[0]
  steps = np.empty((length + 1, len(delays)), np.int32)
  for k, (delay, initial) in enumerate(zip(delays, initial_ids)):
    steps[: delay + 1, k] = initial
    steps[delay + 1 :, k] = streams[: max(length - delay, 0), k]
  return steps[: length + 1]


@dataclasses.dataclass(frozen=True)
class StreamLayout:
  """How a parallel-stream model reads its streams: per stream (text first) its delay and initial token, and which
  streams the model predicts (`predicted`: text and the codebooks it has heads for; the rest, such as another
  speaker's audio, are only read)."""

  delays: tuple[int, ...]
  initial_ids: tuple[int, ...]
  predicted: int  # streams 0..predicted-1 have a head

  @property
  def num_streams(self) -> int:
    return len(self.delays)


@dataclasses.dataclass(frozen=True)
class StreamItem:
  """One prefix and its candidates as time-aligned streams [T, S] (text first; -1 = no token, as upstream's zero
  token), and which streams of a candidate are scored (`scored`, stream indices: (0,) the text stream, (1,) the
  first codebook, ...). Tokens of -1 are never scored."""

  prefix: np.ndarray
  candidates: tuple[np.ndarray, ...]
  scored: tuple[int, ...]
  name: str = ""


def _stream_unit_steps(item: StreamItem, layout: StreamLayout, flush: bool):
  """(prefix steps [P + 1, S], per candidate (steps [n, S], weights [n, S])) in delayed step space. With `flush`,
  each candidate runs max(delays) steps longer with -1 in every stream, so that its delayed streams' last tokens
  are predicted too (upstream's forward leaves them out: the last `delay` steps of a delayed stream are masked)."""
  prefix = np.asarray(item.prefix)
  p = len(prefix)
  extra = max(layout.delays) if flush else 0
  delays = np.asarray(layout.delays)
  prefix_steps = delay_streams(prefix, layout.delays, layout.initial_ids)
  out = []
  for candidate in item.candidates:
    candidate = np.asarray(candidate)
    tail = np.full((extra, layout.num_streams), -1, np.int32)
    steps = delay_streams(np.concatenate([prefix, candidate, tail]), layout.delays, layout.initial_ids)[p + 1 :]
    # step p + 1 + j holds stream k's token of time p + j - delay_k: the candidate's when that time is in [p, p + n)
    time = np.arange(len(steps))[:, None] - delays[None, :]
    weights = (time >= 0) & (time < len(candidate)) & (steps >= 0)
    weights &= np.isin(np.arange(layout.num_streams), item.scored)[None, :]
    out.append((steps, weights.astype(np.int32)))
  return prefix_steps, out


def _validate_stream_item(index: int, item: StreamItem, layout: StreamLayout) -> str:
  name = item_name(index, item)
  for what, streams in [("prefix", item.prefix)] + [(f"candidate {c}", x) for c, x in enumerate(item.candidates)]:
    streams = np.asarray(streams)
    if streams.ndim != 2 or streams.shape[1] != layout.num_streams:
      raise PackingError(f"{name}: {what} must be [T, {layout.num_streams}] streams, got {streams.shape}")
    if what != "prefix" and len(streams) == 0:
      raise PackingError(f"{name}: {what} is empty")
  bad = [k for k in item.scored if not 0 <= k < layout.predicted]
  if bad or not item.scored:
    raise PackingError(f"{name}: scored streams {list(item.scored)} must be among the {layout.predicted} streams the "
                       "model predicts (0 = text, k = codebook k - 1)")
  return name


def _stream_fit(index: int, item: StreamItem, shape: RowShape, layout: StreamLayout, share_prefix: bool,
                flush: bool) -> bool:
  """Whether a valid item that fits a row is laid shared; a PackingError naming it otherwise. No truncation: a
  delayed prefix cannot lose steps cleanly."""
  name = _validate_stream_item(index, item, layout)
  p = len(item.prefix) + 1  # the initial step opens every item
  lengths = [len(c) + (max(layout.delays) if flush else 0) for c in item.candidates]  # steps predicted
  laid = [n - 1 for n in lengths]  # as text: a candidate's last step is a target only
  if max(lengths) > shape.max_targets:
    raise PackingError(f"{name}: a candidate of {max(lengths)} steps exceeds a row's {shape.max_targets} targets")
  if p + max(laid) > shape.length:
    raise PackingError(f"{name}: {p} prefix + {max(laid)} candidate steps laid exceed the row length {shape.length}")
  return fits_shared(p, laid, lengths, shape, share_prefix)


def check_stream_item(item: StreamItem, shape: RowShape, layout: StreamLayout, share_prefix: bool = True,
                      flush: bool = False) -> None:
  """Raises the PackingError (naming the item) that `pack_streams` would raise for it (see `check_item`)."""
  _stream_fit(0, item, shape, layout, share_prefix, flush)


def pack_streams(
  items: Sequence[StreamItem],
  shape: RowShape,
  layout: StreamLayout,
  share_prefix: bool = True,
  flush: bool = False,
) -> tuple[dict[str, np.ndarray], PackReport]:
  """First-fit-decreasing packing of parallel-stream items (as `pack`, one target per predicted step); rows carry
  the layout's streams. An item that does not fit a row is an error naming it."""
  laid = []
  for index, item in enumerate(items):
    share = _stream_fit(index, item, shape, layout, share_prefix, flush)
    prefix_steps, candidates = _stream_unit_steps(item, layout, flush)
    laid.append(LaidItem({STREAM_ROWS.marker: prefix_steps}, tuple(
      ({STREAM_ROWS.marker: steps[:-1]}, {"target_frame": steps, "target_weight": weights})
      for steps, weights in candidates), share, item.name))
  return pack_laid(laid, shape, share_prefix, lambda count: empty_stream_rows(count, shape, layout.num_streams),
                    PackReport(items=len(items)))


def empty_stream_rows(count: int, shape: RowShape, num_streams: int) -> dict[str, np.ndarray]:
  """`count` padding rows of parallel streams: they score nothing."""
  return STREAM_ROWS.empty(count, shape, {"streams": num_streams})


@dataclasses.dataclass(frozen=True)
class StreamProtocol:
  """How a question is laid on stream rows for the architecture named `architecture` (what a stream spec's
  `architecture` names)."""

  architecture: str
  # (modality name, codebooks) -> per stream (0 = text, k = codebook k - 1) its tokens' weight; 0 = not scored
  weights: Callable[[str, int], tuple[int, ...]]
  # (codebooks, text ids [T] or audio codes [T, codebooks]) -> time-aligned streams [T, 1 + codebooks]
  lay: Callable[..., np.ndarray]


STREAM_PROTOCOLS: Registry[StreamProtocol] = Registry("stream protocol", name_of=lambda p: p.architecture)
register_protocol = STREAM_PROTOCOLS.register


def scored_streams(weights: Sequence[int]) -> tuple[int, ...]:
  """The streams a protocol's per-stream weights score (`StreamItem.scored`): those of positive weight."""
  return tuple(k for k, w in enumerate(weights) if w > 0)


def weigh_streams(rows: dict[str, np.ndarray], weights: Sequence[int]) -> dict[str, np.ndarray]:
  """Rows packed by `pack_streams` (each scored token's `target_weight` 1) -> the same rows with each scored
  token weighted as a protocol's per-stream weights say."""
  weights = np.asarray(weights, np.int32)
  if rows["target_weight"].shape[-1] != len(weights):
    raise ValueError(f"rows carry {rows['target_weight'].shape[-1]} streams, the weights are for {len(weights)}")
  return {**rows, "target_weight": rows["target_weight"] * weights}


def _problems(spec) -> list[str]:
  if spec.stream_delays is None or spec.text_initial_id is None:
    return [f"spec {spec.name}: {' and '.join(SPEC_KEYS)} are set exactly when audio_mode is {NAME}"]
  if spec.architecture is None:
    return [f"spec {spec.name}: {NAME} names the architecture whose protocol lays its streams (`architecture`)"]
  if not spec.codebook_sizes or len(spec.stream_delays) != 1 + len(spec.codebook_sizes) or min(spec.stream_delays) < 0:
    return [f"spec {spec.name}: stream_delays {list(spec.stream_delays)} must give the text stream and each of the "
            f"{len(spec.codebook_sizes)} codebooks a delay >= 0"]
  tokens = [k for k in TOKEN_KEYS if getattr(spec, k) is not None]
  if tokens or not spec.text_vocabulary:
    return [f"spec {spec.name}: {NAME} lays audio on streams of its own: it takes no "
            f"{', '.join(tokens) or 'text_vocabulary: false'}"]
  return []


def _refuse(spec, modality) -> str | None:
  if modality.prefix == SPEECH or modality.candidate != SPEECH:
    return None
  return (f"spec {spec.name} reads parallel streams, whose text stream transcribes the speech beside it frame by "
          f"frame: a text prefix has no speech to continue, so {modality.name} ({modality.title}) cannot be asked of it")


def _blank_codes(rows, metadata):
  """Every code on the codebook streams replaced by code 0 (each stream's initial token kept)."""
  streams = rows[STREAM_ROWS.marker]
  cards = np.asarray(metadata.spec.codebook_sizes[: streams.shape[-1] - 1])
  codes = streams[..., 1 : 1 + len(cards)]
  blanked = np.where((codes >= 0) & (codes < cards), 0, codes)
  return dict(rows, **{STREAM_ROWS.marker: np.concatenate([streams[..., :1], blanked, streams[..., 1 + len(cards):]],
                                                          axis=-1).astype(streams.dtype)})


PARALLEL_STREAMS = register(InputFormat(
  NAME, STREAM_ROWS, spec_keys=SPEC_KEYS, check_spec=_problems, refuse=_refuse,
  num_codebooks=lambda spec, modality: len(spec.codebook_sizes),
  widths=lambda spec, modality: {"streams": 1 + len(spec.codebook_sizes)}, blank_audio=_blank_codes))
