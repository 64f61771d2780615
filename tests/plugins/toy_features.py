"""A model that reads two id streams and a float feature track, which only the tests define: Kimi-Audio's input in
small (MoonshotAI/Kimi-Audio modeling_kimia.py: an audio id stream and a text id stream of equal length through one
embedding table, summed, plus continuous Whisper features at the rows that carry audio, through an adaptor; a
text head and an audio head). Here each position's output predicts the next token (no attention: the seam, not
the model, is what is tested), from the text head for text targets and the audio head for spoken ones.

It is one registration per registry, all in this plugin module (S2SJAX_PLUGINS), and no project file names it:
its input format (typed row fields: two int32 id streams, a float32 feature track of `feature_width`, a 0/1 mask
of the rows that carry features; per target its id and the head that scores it), its encoder (`Encoder`, below,
named lazily by the format), its architecture and its spec. tests/test_input_formats.py builds and scores it
through tasks.prepare and s2sjax.eval, and holds every NLL to a float64 reference computed from its inputs.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from s2sjax.scoring import architectures
from s2sjax.data import formats, packing, spec
from s2sjax.data.modalities import SPEECH
from s2sjax.data.rows import Field, RowFormat
from s2sjax.scoring.scorer import ScoringError, StreamScorer
from tasks import encoders
from tasks.encoders import QuestionEncoder

NAME = "toy_features"
CARD = 16  # codes of its one codebook (precomputed codes, as the tests write them)
FEATURE_WIDTH = 6
TEXT_VOCAB = 151_680  # the Qwen tokenizer's embedding rows (tests' qwen_tokenizer_dir)
TEXT, AUDIO = 0, 1  # which head scores a target

ROWS = RowFormat(
  NAME, marker="audio_ids",
  own_positions=(Field("audio_ids", "L", 0), Field("text_ids", "L", 0),
                 Field("features", "L", 0.0, dtype="float32", width="features"), Field("feature_mask", "L", 0)),
  own_targets=(Field("target_ids", "M", 0), Field("target_head", "M", TEXT)),
  scored=("audio_ids", "text_ids", "features", "feature_mask", "target_pos", "target_ids", "target_head"),
)


def ids(text_vocab: int) -> dict[str, int]:
  """The ids past the text vocabulary, as Kimi lays them (its `kimia_text_blank` and friends): each stream's blank,
  then the audio codes from an offset."""
  return {"text_blank": text_vocab, "audio_blank": text_vocab + 1, "audio_offset": text_vocab + 2}


def features_of(codes: np.ndarray) -> np.ndarray:
  """The feature track of a recording's frames [T, FEATURE_WIDTH] float32, from its codes (Kimi computes Whisper
  features from the wave; any deterministic function of the recording serves the seam)."""
  table = np.random.default_rng(7).normal(size=(CARD, FEATURE_WIDTH)).astype(np.float32)
  frames = np.arange(len(codes), dtype=np.float32)[:, None]
  return (table[np.asarray(codes)[:, 0]] + np.sin(frames / 3.0)).astype(np.float32)


# ---- the input format -----------------------------------------------------------------------------------------------


def _spec_problems(laid) -> list[str]:
  options = laid.options or {}
  missing = [k for k in (*ids(0), "feature_width") if not isinstance(options.get(k), int)]
  if missing or len(laid.codebook_sizes) != 1:
    return [f"spec {laid.name}: {NAME} needs one codebook and the integer options {', '.join(missing)}"]
  return []


def _blank_audio(rows, metadata):
  """Features zeroed and every audio id set to code 0's."""
  offset = metadata.spec.options["audio_offset"]
  audio = np.where(rows["audio_ids"] >= offset, offset, rows["audio_ids"]).astype(rows["audio_ids"].dtype)
  return dict(rows, audio_ids=audio, features=np.zeros_like(rows["features"]))


FORMAT = formats.register(formats.InputFormat(
  NAME, ROWS, check_spec=_spec_problems,
  widths=lambda laid, modality: {"features": laid.options["feature_width"]}, blank_audio=_blank_audio))


class Encoder(QuestionEncoder):
  """A side of a question as per-position fields: a recording's frames on the audio stream (code + offset, the
  text stream blank), with their features for a spoken prefix (the user's audio, as Kimi reads it) and none for a
  spoken candidate (the model's own speech, predicted by the audio head); text on the text stream, the audio
  stream blank."""

  def _side(self, text: np.ndarray | None = None, codes: np.ndarray | None = None, features: bool = False) -> dict:
    options = self.spec.options
    n = len(text) if text is not None else len(codes)
    side = {"audio_ids": np.full(n, options["audio_blank"], np.int32), "text_ids": np.full(n, options["text_blank"],
                                                                                         np.int32),
            "features": np.zeros((n, options["feature_width"]), np.float32), "feature_mask": np.zeros(n, np.int32)}
    if text is not None:
      side["text_ids"] = np.asarray(text, np.int32)
    else:
      side["audio_ids"] = (options["audio_offset"] + np.asarray(codes)[:, 0]).astype(np.int32)
      if features:
        side["features"], side["feature_mask"] = features_of(codes), np.ones(n, np.int32)
    return side

  def prefix(self, question, c):
    if self.modality.prefix == SPEECH:
      codes, seconds = self._prefix_codes(question, c)
      return self._side(codes=codes, features=True), None, seconds
    return self._side(text=self.text_ids(question.prefixes[c], special=True)), None, 0.0

  def candidate(self, question, c):
    if self.modality.candidate == SPEECH:
      codes, seconds = self._candidate_codes(question, c)
      return dict(self._side(codes=codes), target_ids=codes[:, 0].astype(np.int32),
                  target_head=np.full(len(codes), AUDIO, np.int32)), seconds
    separator = self.spec.text_separator[self.language(question)] if self.modality.prefix != SPEECH else ""
    text = self.text_ids(separator + question.candidates[c], special=False)
    return dict(self._side(text=text), target_ids=text, target_head=np.full(len(text), TEXT, np.int32)), 0.0

  def scored(self, candidate) -> int:
    return len(candidate["target_ids"])

  def item(self, prefix, candidates, codes, name):
    """Each candidate lays every position but its last, whose token is only predicted."""
    split = lambda side: ({k: side[k][:-1] for k in prefix}, {k: side[k] for k in ("target_ids", "target_head")})
    return packing.LaidItem(prefix, tuple(split(side) for side in candidates), share=True, name=name)

  def check(self, item, shape, share_prefix, overlong):
    packing.fit_laid(0, item, shape, share_prefix)

  def pack(self, items, shape, share_prefix, overlong):
    widths = FORMAT.widths(self.spec, self.modality)
    laid = [dataclasses.replace(item, share=packing.fit_laid(i, item, shape, share_prefix))
            for i, item in enumerate(items)]
    return packing.pack_laid(laid, shape, share_prefix, lambda count: ROWS.empty(count, shape, widths))


ENCODERS = encoders.register(encoders.FormatEncoders(NAME, f"{__name__}:Encoder"))


SPEC = spec.register(spec.Spec(
  name=NAME, audio_mode=NAME, audio_tokenizer={"type": "precomputed"}, codebook_sizes=(CARD,), architecture=NAME,
  options=dict(ids(TEXT_VOCAB), feature_width=FEATURE_WIDTH)))


# ---- the architecture -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToyFeaturesConfig:
  text_vocab: int
  card: int
  dim: int
  feature_width: int
  family: str = NAME

  @property
  def rows(self) -> int:
    """Embedding rows: the text vocabulary, the two blanks, the codes."""
    return self.text_vocab + 2 + self.card

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "ToyFeaturesConfig":
    return cls(**json.loads(text))


def abstract_params(config: ToyFeaturesConfig, param_dtype=jnp.float32) -> dict:
  shape = lambda *dims: jax.ShapeDtypeStruct(dims, param_dtype)
  return {"embed": shape(config.rows, config.dim), "adaptor": shape(config.feature_width, config.dim),
          "text_head": shape(config.dim, config.text_vocab), "audio_head": shape(config.dim, config.card)}


def param_logical_axes(config: ToyFeaturesConfig) -> dict:
  return {name: PartitionSpec(None, None) for name in ("embed", "adaptor", "text_head", "audio_head")}


def hidden(params, audio_ids, text_ids, features, feature_mask):
  """Each position's state: both ids' embeddings summed, plus the adapted features where the mask says."""
  adapted = jnp.einsum("...f,fd->...d", features, params["adaptor"], precision=jax.lax.Precision.HIGHEST)
  return params["embed"][audio_ids] + params["embed"][text_ids] + feature_mask[..., None] * adapted


def score_batch(config: ToyFeaturesConfig, dtype, target_chunk: int, num_slots: int, params, batch: dict) -> dict:
  del dtype, target_chunk  # fp32; the toy's heads are small
  state = hidden(params, batch["audio_ids"], batch["text_ids"], batch["features"],
                 batch["feature_mask"].astype(jnp.float32))
  state = jnp.take_along_axis(state, batch["target_pos"][..., None], axis=1)  # [B, M, D]

  def nll(head, ids):
    logits = jnp.einsum("bmd,dv->bmv", state, params[head], precision=jax.lax.Precision.HIGHEST)
    ids = jnp.clip(ids, 0, logits.shape[-1] - 1)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]

  target_nll = jnp.where(batch["target_head"] == TEXT, nll("text_head", batch["target_ids"]),
                         nll("audio_head", batch["target_ids"]))
  onehot = (batch["target_slot"][..., None] == jnp.arange(num_slots)).astype(jnp.float32)
  return {"target_nll": target_nll,
          "nll_sum": jnp.einsum("bm,bmc->bc", target_nll, onehot, precision=jax.lax.Precision.HIGHEST),
          "n_tokens": onehot.sum(axis=1).astype(jnp.int32)}


def check_ids(rows: dict, config: ToyFeaturesConfig) -> None:
  for field in ("audio_ids", "text_ids"):
    if ((rows[field] < 0) | (rows[field] >= config.rows)).any():
      raise ScoringError(f"{field} outside the embedding's {config.rows} rows")
  scored = rows["target_slot"] >= 0
  top = np.where(rows["target_head"] == TEXT, config.text_vocab, config.card)
  if (scored & ((rows["target_ids"] < 0) | (rows["target_ids"] >= top))).any():
    raise ScoringError("a scored target outside its head")


def scorer(config, shape, mesh=None, batch_size=8, dtype=jnp.float32, attention="xla"):
  del attention
  return StreamScorer(config, shape, score_batch, check_ids, abstract_params(config), param_logical_axes(config),
                      mesh=mesh, batch_size=batch_size, dtype=dtype, row_format=ROWS)


def check_fit(config: ToyFeaturesConfig, data) -> None:
  laid = data.metadata.spec
  if laid.options != dict(ids(config.text_vocab), feature_width=config.feature_width) or laid.codebook_sizes != (
      config.card,):
    raise architectures.FitError(f"spec {laid.name} does not lay the ids and features this {NAME} model reads")


ARCHITECTURE = architectures.register(architectures.Architecture(
  NAME, ToyFeaturesConfig, ROWS, abstract_params, param_logical_axes, scorer,
  text_rows=lambda config: config.text_vocab, check_fit=check_fit, check_ids=check_ids,
  parse_config=lambda fields: ToyFeaturesConfig(**fields)))
