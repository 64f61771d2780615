"""A second architecture that reads stream rows, which only the tests define: per codebook stream, a bigram table
(the step's token from the previous step's token of the same stream), scored on spoken candidates (s2s) with every
codebook weighed 1 and the text stream left silent. Registered through S2SJAX_PLUGINS with a spec of its own
(`toy_streams`, audio as precomputed codes), it is built by tasks.prepare and scored by s2sjax.eval with no project
file naming it."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from s2sjax.scoring import architectures
from s2sjax.data import rows, spec
from s2sjax.data.formats import streams
from s2sjax.scoring.scorer import ScoringError, StreamScorer

NAME = "toy_streams"
CODEBOOKS, CARD = 2, 16


@dataclasses.dataclass(frozen=True)
class ToyStreamsConfig:
  text_vocab: int  # the text tokenizer it reads (its text stream has no head: nothing text is scored)
  codebooks: int
  card: int  # codes per codebook; id `card` is each codebook stream's initial token
  family: str = NAME

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "ToyStreamsConfig":
    return cls(**json.loads(text))


def abstract_params(config: ToyStreamsConfig, param_dtype=jnp.float32) -> dict:
  return {"bigram": jax.ShapeDtypeStruct((config.codebooks, config.card + 1, config.card), param_dtype)}


def param_logical_axes(config: ToyStreamsConfig) -> dict:
  return {"bigram": PartitionSpec(None, None, None)}


def previous_codes(stream: jax.Array, card: int) -> jax.Array:
  """A codebook stream's previous-step tokens as table rows: silence (-1) reads as the initial token's row."""
  return jnp.where(stream < 0, card, stream)


def score_batch(config: ToyStreamsConfig, dtype, target_chunk: int, num_slots: int, params, batch: dict) -> dict:
  del dtype, target_chunk  # fp32 and no vocabulary to chunk
  previous = jnp.take_along_axis(batch[rows.STREAM_ROWS.marker], batch["target_pos"][..., None], axis=1)
  frame, weight = batch["target_frame"], batch["target_weight"]
  nll = jnp.zeros(frame.shape[:2], jnp.float32)
  for k in range(config.codebooks):
    logits = params["bigram"][k][previous_codes(previous[..., 1 + k], config.card)]  # [B, M, card]
    ids = jnp.clip(frame[..., 1 + k], 0, config.card - 1)  # unscored entries weigh 0
    picked = jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]
    nll += (jax.nn.logsumexp(logits, axis=-1) - picked) * weight[..., 1 + k].astype(jnp.float32)
  onehot = (batch["target_slot"][..., None] == jnp.arange(num_slots)).astype(jnp.float32)
  return {"target_nll": nll, "nll_sum": jnp.einsum("bm,bmc->bc", nll, onehot, precision=jax.lax.Precision.HIGHEST),
          "n_tokens": onehot.sum(axis=1).astype(jnp.int32)}


def check_ids(packed: dict, config: ToyStreamsConfig) -> None:
  codes = packed[rows.STREAM_ROWS.marker][..., 1:]
  if codes.shape[-1] != config.codebooks or ((codes < -1) | (codes > config.card)).any():
    raise ScoringError(f"rows do not hold {config.codebooks} codebook streams of {config.card} codes")


def scorer(config, shape, mesh=None, batch_size=8, dtype=jnp.float32, attention="xla"):
  del attention
  return StreamScorer(config, shape, score_batch, check_ids, abstract_params(config), param_logical_axes(config),
                      mesh=mesh, batch_size=batch_size, dtype=dtype)


def check_fit(config: ToyStreamsConfig, data) -> None:
  laid = data.metadata.spec
  if laid.codebook_sizes != (config.card,) * config.codebooks or any(laid.stream_delays):
    raise architectures.FitError(f"spec {laid.name} does not lay {config.codebooks} undelayed codebooks of "
                                 f"{config.card} codes")


def weights(modality: str, codebooks: int) -> tuple[int, ...]:
  if modality != "s2s":
    raise ValueError(f"{NAME} scores spoken candidates after spoken prefixes only (s2s), not {modality}")
  return (0,) + (1,) * codebooks


def lay(codebooks: int, text=None, audio=None) -> np.ndarray:
  """The audio codes on the codebook streams, the text stream silent (the toy reads no text)."""
  audio = np.asarray(audio, np.int32)
  return np.concatenate([np.full((len(audio), 1), -1, np.int32), audio.reshape(len(audio), codebooks)], axis=1)


ARCHITECTURE = architectures.register(architectures.Architecture(
  NAME, ToyStreamsConfig, rows.STREAM_ROWS, abstract_params, param_logical_axes, scorer,
  text_rows=lambda config: config.text_vocab, check_fit=check_fit, check_ids=check_ids,
  parse_config=lambda fields: ToyStreamsConfig(**fields)))

PROTOCOL = streams.register_protocol(streams.StreamProtocol(NAME, weights, lay))

SPEC = spec.register(spec.Spec(
  name=NAME, audio_mode=streams.NAME, audio_tokenizer={"type": "precomputed"},
  codebook_sizes=(CARD,) * CODEBOOKS, stream_delays=(0,) * (1 + CODEBOOKS), text_initial_id=0, architecture=NAME))
