"""Kimi-Audio's network (MoonshotAI/Kimi-Audio, `finetune_codes/modeling_kimia.py` at 349251e, the release's
`modeling_moonshot_kimia.py`) in JAX, as pure functions of a parameter tree.

Two id streams of equal length, the audio stream (`input_ids`) and the text stream (`text_input_ids`), read through
one embedding table and summed (:672, :721). At the rows of the continuous mask (the GLM-4-Voice code rows between
media_begin and media_end) the audio stream's embedding is mixed with Whisper-large-v3 features through the
VQAdaptor (Linear, SiLU, Linear, LayerNorm of eps `rms_norm_eps`, :519-531): `(embed(audio id) + adaptor(feature))
* sqrt(2)` (:688-719). Then the Qwen2-style main stack (the shared decoder's `DecoderLayer`: q/k/v biases,
rotate-half rope, pre-RMSNorm, SwiGLU), plain causal attention, positions arange. Two heads, with the names the
modeling file swaps (:905-909) and `kimia_infer/api/kimia.py:114` swaps back:

  text head   lm_head on the final norm of the whole main stack;
  audio head  mimo_output on mimo_norm of the branch: `mimo_layers` layers that start from the OUTPUT of main
              layer `mimo_from_layer` (:752-753, :766-790), while the main stack still runs all its layers.

The parameter tree is the shared decoder's (`embed`, `layers` stacked, `final_norm`, `lm_head`: the main stack and
its text head, so the checkpoint stores `layers` one at a time as for every decoder) plus `mimo_layers` (stacked),
`mimo_norm`, `mimo_output` and `vq_adaptor`. Attention takes the decoder's masks, so packed rows (a prefix shared
by its candidates, item-local attention) run as the decoder's do.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from s2sjax.numerics import norms
from s2sjax.model import decoder
from s2sjax.numerics import rotary
from s2sjax.model.attention import LocalWindow, local_window_mask, packed_attention_mask
from s2sjax.model.config import AroundDecoder, ConfigError, ModelConfig

NAME = "kimi_audio"  # model_config.json's `family` (s2sjax/scoring/architectures/kimi_audio.py registers it)
Params = dict[str, Any]

# The VQAdaptor's logical axes: its first kernel reads the 4 x d_model Whisper feature, sharded as an MLP's input.
_ADAPTOR_AXES = {
  "in": {"kernel": PartitionSpec("mlp", "embed"), "bias": PartitionSpec("embed")},
  "out": {"kernel": PartitionSpec("mlp", "embed"), "bias": PartitionSpec("embed")},
  "norm": {"scale": PartitionSpec("norm"), "bias": PartitionSpec("norm")},
}


@dataclasses.dataclass(frozen=True)
class KimiAudioConfig(AroundDecoder):
  """Kimi-Audio's architecture (hashable: a static argument of `jax.jit`). Parsed from a release's config.json by
  `s2sjax.scoring.architectures.kimi_audio.parse_config`; the id ranges come from that config, never from constants."""

  decoder: ModelConfig  # the main stack: one embedding table for both streams, the layers, final norm, lm_head
  mimo_layers: int  # kimia_mimo_layers: the audio branch's layers
  mimo_from_layer: int  # kimia_mimo_transformer_from_layer_index: the branch reads this main layer's output
  adaptor_input_dim: int | None  # kimia_adaptor_input_dim (4 x Whisper d_model); None: use_whisper_feature false
  token_offset: int  # kimia_token_offset: GLM-4-Voice code k is audio id token_offset + k
  audio_codes: int  # GLM-4-Voice codes: kimia_audio_output_vocab - num_audio_special_tokens
  text_output_vocab: int  # kimia_text_output_vocab: ids below it are the text tokenizer's
  media_begin: int  # kimia_media_begin: the audio-stream id before a message's codes
  media_end: int  # kimia_media_end: and after them
  family: str = NAME

  def __post_init__(self):
    d = self.decoder
    problems = [] if self.family == NAME else [f"family {self.family!r} is not {NAME!r}"]
    if not 0 <= self.mimo_from_layer < d.num_layers:
      problems.append(f"the audio branch starts from main layer {self.mimo_from_layer}, but the main stack has "
                      f"{d.num_layers} layers (0..{d.num_layers - 1})")
    if self.mimo_layers < 1:
      problems.append(f"kimia_mimo_layers={self.mimo_layers}: the audio head needs at least one branch layer")
    if self.token_offset + self.audio_codes > d.vocab_size:
      problems.append(f"codes {self.token_offset}..{self.token_offset + self.audio_codes - 1} (kimia_token_offset + "
                      f"{self.audio_codes} codes) run past the {d.vocab_size}-row embedding")
    if problems:
      raise ConfigError("Kimi-Audio config: " + "; ".join(problems))

  def num_params(self) -> int:
    """Every parameter: the main stack with its head, the branch with its norm and head, the adaptor."""
    d = self.decoder
    per_layer = dataclasses.replace(d, num_layers=2).num_params() - dataclasses.replace(d, num_layers=1).num_params()
    adaptor = 0
    if self.adaptor_input_dim:
      adaptor = self.adaptor_input_dim * d.hidden_size + d.hidden_size * d.hidden_size + 4 * d.hidden_size
    return d.num_params() + self.mimo_layers * per_layer + d.hidden_size + d.vocab_size * d.hidden_size + adaptor

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "KimiAudioConfig":
    fields = json.loads(text)  # a key missing or unknown: the dataclass's own KeyError / TypeError
    return cls(**dict(fields, decoder=ModelConfig.from_json(json.dumps(fields["decoder"]))))


def _branch_config(config: KimiAudioConfig) -> ModelConfig:
  """The audio branch as a decoder of its own: the main stack's layer shape, `mimo_layers` deep."""
  return dataclasses.replace(config.decoder, num_layers=config.mimo_layers)


def _adaptor_shapes(config: KimiAudioConfig, param_dtype) -> Params:
  d, f = config.decoder.hidden_size, config.adaptor_input_dim
  leaf = lambda *shape, dtype=param_dtype: jax.ShapeDtypeStruct(shape, dtype)
  return {"in": {"kernel": leaf(f, d), "bias": leaf(d)}, "out": {"kernel": leaf(d, d), "bias": leaf(d)},
          "norm": {"scale": leaf(d, dtype=jnp.float32), "bias": leaf(d, dtype=jnp.float32)}}


def _with_branch(main: Params, branch: Params, adaptor: Params | None) -> Params:
  tree = {**main, "mimo_layers": branch["layers"], "mimo_norm": branch["final_norm"],
          "mimo_output": branch["lm_head"]}
  if adaptor is not None:
    tree["vq_adaptor"] = adaptor
  return tree


def abstract_params(config: KimiAudioConfig, param_dtype=jnp.float32) -> Params:
  """The parameter tree as `jax.ShapeDtypeStruct`s: the decoder's (norm scales fp32, as there), then the branch's
  layers, norm and head, and the adaptor."""
  adaptor = _adaptor_shapes(config, param_dtype) if config.adaptor_input_dim else None
  return _with_branch(decoder.abstract_params(config.decoder, param_dtype),
                      decoder.abstract_params(_branch_config(config), param_dtype), adaptor)


def param_logical_axes(config: KimiAudioConfig) -> Params:
  """A tree parallel to the params holding each leaf's logical axis names (the decoder's for its parts)."""
  return _with_branch(decoder.param_logical_axes(config.decoder), decoder.param_logical_axes(_branch_config(config)),
                      _ADAPTOR_AXES if config.adaptor_input_dim else None)


# ---- the forward: pure functions of (config, params, arrays) ---------------------------------------------------------


def _precision(dtype) -> jax.lax.Precision:
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


def _dense(x, params: Params, dtype):
  y = jnp.einsum("...i,io->...o", x, params["kernel"].astype(dtype), precision=_precision(dtype))
  return y + params["bias"].astype(dtype) if "bias" in params else y


def adaptor(config: KimiAudioConfig, params: Params, features: jax.Array, dtype=jnp.float32) -> jax.Array:
  """VQAdaptor (:519-531): Linear(4d, H), SiLU, Linear(H, H), LayerNorm(H, eps=rms_norm_eps) over [..., 4d]."""
  p = params["vq_adaptor"]
  h = _dense(jax.nn.silu(_dense(features.astype(dtype), p["in"], dtype)), p["out"], dtype)
  return norms.layer_norm(h, p["norm"]["scale"].astype(dtype), p["norm"]["bias"].astype(dtype),
                           config.decoder.rms_norm_eps)


def embed_inputs(config: KimiAudioConfig, params: Params, audio_ids: jax.Array, text_ids: jax.Array,
                 features: jax.Array | None, continuous: jax.Array, dtype=jnp.float32) -> jax.Array:
  """[B, L, H] inputs of the first layer (:668-723): embed(audio id), at continuous rows mixed with the adaptor's
  output of that row's feature as (embed + adaptor) * sqrt(2), then embed(text id) added on every row.

  features [B, L, 4d] float is read at the continuous rows only (anything elsewhere); None, or a model without the
  adaptor, reads the audio ids alone (text-only requests: upstream's whisper_input_feature=None). Upstream skips the
  text embedding when a whole text stream sums to 0 (:720), which only a single generated step can do (every
  teacher-forced sequence holds BLANK); it is always added here."""
  table = params["embed"]["embedding"]
  audio = jnp.take(table, audio_ids, axis=0).astype(dtype)
  if features is not None and config.adaptor_input_dim:
    mixed = (audio + adaptor(config, params, features, dtype)) * jnp.asarray(math.sqrt(2.0), dtype)
    audio = jnp.where(continuous[..., None], mixed, audio)
  return audio + jnp.take(table, text_ids, axis=0).astype(dtype)


def _run_layers(layer: decoder.DecoderLayer, stacked: Params, first: int, stop: int, x, cos, sin, mask,
                segment_ids, branch_ids):
  """Layers first..stop-1 of a stacked tree, one `lax.scan` reading each layer's slice of the stack in place."""
  if stop <= first:
    return x

  def body(h, index):
    params = jax.tree.map(lambda leaf: jax.lax.dynamic_index_in_dim(leaf, index, keepdims=False), stacked)
    return layer.apply({"params": params}, h, cos, sin, mask, segment_ids, branch_ids)[0], None

  return jax.lax.scan(body, x, jnp.arange(first, stop))[0]


def hidden_states(config: KimiAudioConfig, params: Params, audio_ids: jax.Array, text_ids: jax.Array,
                  features: jax.Array | None, continuous: jax.Array, positions: jax.Array, mask: jax.Array,
                  segment_ids: jax.Array | None = None, branch_ids: jax.Array | None = None, *, dtype=jnp.float32,
                  attention: str = "xla", window: LocalWindow | None = None,
                  audio_head: bool = True) -> tuple[jax.Array, jax.Array | None]:
  """(text hidden, audio hidden) [B, L, H], each after its head's norm: what `text_logits` / `audio_logits` read.

  audio_ids, text_ids, positions [B, L] int; features [B, L, 4d] float and continuous [B, L] bool
  (`embed_inputs`); mask the decoder's ([B, L, L] bool, or with a `window` its window mask,
  `local_window_mask`) with segment_ids / branch_ids [B, L] for the kernels that read them. Without
  `audio_head` the branch is not run and its hidden states are None."""
  c = config.decoder
  layer = decoder.DecoderLayer(c, dtype, dtype, attention, window)
  cos, sin = rotary.rotary_angles(positions, c.rotary_dim, c.rope_theta)
  args = (cos, sin, mask, segment_ids, branch_ids)
  x = embed_inputs(config, params, audio_ids, text_ids, features, continuous, dtype)
  tap = _run_layers(layer, params["layers"], 0, config.mimo_from_layer + 1, x, *args)
  main = _run_layers(layer, params["layers"], config.mimo_from_layer + 1, c.num_layers, tap, *args)
  text = norms.rms_norm(main, params["final_norm"]["scale"].astype(dtype), c.rms_norm_eps)
  if not audio_head:
    return text, None
  branch = _run_layers(layer, params["mimo_layers"], 0, config.mimo_layers, tap, *args)
  return text, norms.rms_norm(branch, params["mimo_norm"]["scale"].astype(dtype), c.rms_norm_eps)


def _head(hidden: jax.Array, kernel: jax.Array) -> jax.Array:
  dtype = hidden.dtype
  return jnp.einsum("...d,dv->...v", hidden, kernel.astype(dtype), precision=_precision(dtype)).astype(jnp.float32)


def text_logits(params: Params, text_hidden: jax.Array) -> jax.Array:
  """fp32 text-head logits (lm_head) over the full vocabulary for text hidden states [..., H]."""
  return _head(text_hidden, params["lm_head"]["kernel"])


def audio_logits(params: Params, audio_hidden: jax.Array) -> jax.Array:
  """fp32 audio-head logits (mimo_output) over the full vocabulary for the branch's hidden states [..., H]."""
  return _head(audio_hidden, params["mimo_output"]["kernel"])


@functools.partial(jax.jit, static_argnums=0)
def _causal_log_probs(config: KimiAudioConfig, params: Params, audio_ids, text_ids, features, continuous):
  batch, length = audio_ids.shape
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  mask = packed_attention_mask(jnp.ones((batch, length), jnp.int32))
  text, audio = hidden_states(config, params, audio_ids, text_ids, features, continuous, positions, mask)
  return jax.nn.log_softmax(text_logits(params, text), -1), jax.nn.log_softmax(audio_logits(params, audio), -1)


def sequence_log_probs(config: KimiAudioConfig, params: Params, audio_ids: np.ndarray, text_ids: np.ndarray,
                       features: np.ndarray | None, continuous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(text head, audio head) fp32 log-softmax [T, vocab] at every position of one plain causal sequence (positions
  arange, as upstream's forward): row t predicts position t + 1 of the text / audio stream. features [T, 4d] (or
  None for a request without audio). The check against the reference: the scorer never builds full logits."""
  features = None if features is None else jnp.asarray(features, jnp.float32)[None]
  text, audio = _causal_log_probs(
    config, params, jnp.asarray(audio_ids, jnp.int32)[None], jnp.asarray(text_ids, jnp.int32)[None], features,
    jnp.asarray(continuous, bool)[None])
  return np.asarray(text, np.float32)[0], np.asarray(audio, np.float32)[0]
