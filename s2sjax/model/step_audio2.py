"""Step-Audio-2-mini and -mini-Base's network (stepfun-ai, the release's `modeling_step_audio_2.py`, git blob
50dfd88a) in JAX: its LLM is transformers' Qwen2 (`Qwen2Model` + an untied `lm_head`, :304-336), read here as the
shared decoder; what it adds is where the speech enters. The forward embeds the ids, then overwrites the rows right
after each `<audio_start>` (id 151688, hard-coded at :353-357) with the adaptor's output of that audio's mel: one row
per `<audio_patch>` the prompt laid. The encoder and adaptor that make those rows (AudioEncoder :230-264, Adaptor
:266-302) run at build time (`tasks/audio/step_audio2.py`), so the scored rows carry them as a feature track of the
LLM's width, placed by `Decoder(features=, continuous=)`.

The parameter tree is the decoder's; the encoder's and adaptor's sizes are kept beside it (`EncoderShape`) so the
planner and the fit checks know them.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax.data.formats.step_audio2 import ADAPTOR_WIDTH, AUDIO_CODES, AUDIO_OFFSET, EncoderShape
from s2sjax.model import decoder
from s2sjax.model.attention import packed_attention_mask
from s2sjax.model.config import AroundDecoder, ConfigError, ModelConfig

NAME = "step_audio2"  # model_config.json's `family` (s2sjax/scoring/architectures/step_audio2.py registers it)
AUDIO_START = 151688  # <audio_start>: the adaptor rows start right after it (modeling_step_audio_2.py:353)


@dataclasses.dataclass(frozen=True)
class StepAudio2Config(AroundDecoder):
  """Step-Audio 2's architecture (hashable: a static argument of `jax.jit`), parsed from a release's config.json by
  `s2sjax.scoring.architectures.step_audio2.parse_config`."""

  decoder: ModelConfig  # the Qwen2 LLM: embed_tokens, layers, norm, lm_head
  encoder: EncoderShape
  family: str = NAME

  def __post_init__(self):
    problems = [] if self.family == NAME else [f"family {self.family!r} is not {NAME!r}"]
    if self.decoder.vocab_size < AUDIO_OFFSET + AUDIO_CODES:
      last = AUDIO_OFFSET + AUDIO_CODES - 1
      problems.append(f"vocab_size={self.decoder.vocab_size}: the speech ids {AUDIO_OFFSET}..{last} (and "
                      f"<audio_start> {AUDIO_START}, which the forward hard-codes) must be rows of the table")
    if self.encoder.llm_dim != self.decoder.hidden_size:
      problems.append(f"the adaptor writes rows of width llm_dim={self.encoder.llm_dim} into embeddings of width "
                      f"hidden_size={self.decoder.hidden_size}")
    if problems:
      raise ConfigError("Step-Audio 2 config: " + "; ".join(problems))

  def num_params(self) -> int:
    """The LLM's parameters: what the checkpoint holds and the scoring step loads (the encoder and adaptor,
    `encoder.num_params()`, run at build time)."""
    return self.decoder.num_params()

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "StepAudio2Config":
    fields = json.loads(text)
    return cls(**dict(fields, decoder=ModelConfig.from_json(json.dumps(fields["decoder"])),
                      encoder=EncoderShape(**fields["encoder"])))


def abstract_params(config: StepAudio2Config, param_dtype=jnp.float32):
  return decoder.abstract_params(config.decoder, param_dtype)


def param_logical_axes(config: StepAudio2Config):
  return decoder.param_logical_axes(config.decoder)


def release_audio_tensors(shape: EncoderShape) -> dict[str, tuple[int, ...]]:
  """The release's `encoder.*` and `adapter.*` tensors and their shapes (AudioEncoder :230-244, Adaptor :266-283)."""
  d, out = shape.n_state, {}

  def linear(key: str, n_out: int, n_in: int, bias: bool = True) -> dict:
    return {f"{key}.weight": (n_out, n_in), **({f"{key}.bias": (n_out,)} if bias else {})}

  norm = lambda key: {f"{key}.weight": (d,), f"{key}.bias": (d,)}
  out.update({"encoder.conv1.weight": (d, shape.n_mels, 3), "encoder.conv1.bias": (d,),
              "encoder.conv2.weight": (d, d, 3), "encoder.conv2.bias": (d,),
              "encoder.positional_embedding.weight": (shape.n_ctx, d), **norm("encoder.after_norm")})
  for i in range(shape.n_layer):
    block = f"encoder.blocks.{i}"
    out.update({**linear(f"{block}.attn.query", d, d), **linear(f"{block}.attn.key", d, d, bias=False),
                **linear(f"{block}.attn.value", d, d), **linear(f"{block}.attn.out", d, d),
                **norm(f"{block}.attn_ln"), **linear(f"{block}.mlp.0", 4 * d, d), **linear(f"{block}.mlp.2", d, 4 * d),
                **norm(f"{block}.mlp_ln")})
  out.update({"adapter.conv.weight": (d, d, shape.kernel_size), "adapter.conv.bias": (d,),
              **linear("adapter.linear1", ADAPTOR_WIDTH, d), **linear("adapter.linear2", shape.llm_dim, ADAPTOR_WIDTH)})
  return out


@functools.partial(jax.jit, static_argnums=0)
def _causal(config: StepAudio2Config, params, ids, features, continuous):
  batch, length = ids.shape
  model = decoder.Decoder(config.decoder)
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  mask = packed_attention_mask(jnp.ones((batch, length), jnp.int32))
  hidden = model.apply({"params": params}, ids, positions, mask, features=features, continuous=continuous)
  return jax.nn.log_softmax(model.apply({"params": params}, hidden, method=decoder.Decoder.logits), -1)


def sequence_log_probs(config: StepAudio2Config, params, ids: np.ndarray, features: np.ndarray | None = None,
                       continuous: np.ndarray | None = None) -> np.ndarray:
  """fp32 log-softmax [L, vocab] at every position of one causal sequence (positions arange, as upstream's
  forward); features [L, hidden] read at the `continuous` rows (`patch_rows`). The check against the reference:
  the scorer never builds full logits."""
  if features is None:
    features, continuous = np.zeros((len(ids), config.decoder.hidden_size)), np.zeros(len(ids), bool)
  out = _causal(config, params, jnp.asarray(ids, jnp.int32)[None], jnp.asarray(features, jnp.float32)[None],
                jnp.asarray(continuous, bool)[None])
  return np.asarray(out, np.float32)[0]
