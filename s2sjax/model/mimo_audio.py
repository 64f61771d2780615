"""MiMo-Audio-7B's network (XiaomiMiMo/MiMo-Audio @691ce54, `src/mimo_audio/modeling_mimo_audio.py`) in JAX, as
pure functions of a parameter tree.

A sequence is a run of patches: each patch is one position of the global Qwen2 stack and holds one text id and
`group_size` (4) frames of `audio_channels` (8) RVQ codes. Its input (`_prepare_input_embeds`, :331-387):

  speech   per channel c the code's row of `speech_embeddings[c]`, zeroed where the code is that channel's empty
           id (:367-368; the tables' padding rows are not zero), summed over the channels in a bfloat16 tensor
           that rounds after each channel is added (:349-370), zeroed unless the patch's text id is <|empty|>
           (:347, :372); then the input local transformer over the patch's 4 frames, bidirectional (:308-329),
           zeroed again (:376), the 4 outputs side by side through `speech_group_downcast` (:379-381);
  text     embed_tokens(text id), zeroed where the id is <|empty|> (:383-385); the patch's input is the sum.

Because that sum is a bfloat16 tensor, the input local transformer (a Qwen2Model, :259) gets its rotary cos/sin
in bfloat16 and its first layer's input norm rounds the normalised input to bfloat16 (Qwen2RMSNorm returns
`weight * x.to(input dtype)`); from the first residual add on it computes in the run's dtype.

Then the global Qwen2 stack (the shared decoder's `DecoderLayer`), causal over patches at positions arange; the text
head is `lm_head` on its final norm, read after every patch. The patch decoder (`local_forward`, :424-476) predicts
the NEXT patch's codes from `hidden_states_downcast(final-normed hidden)`: a causal Qwen2 stack (`local`) over
`group_size + max(delay)` steps at positions 0..; at step t channel c predicts frame t - delay[c] (when in range)
with `local_transformer_lm_heads[c]`, and the next step's input is the sum of the speech embeddings of the codes
chosen at step t (here: the teacher's codes).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from s2sjax.model import decoder
from s2sjax.numerics import rotary
from s2sjax.numerics import norms
from s2sjax.model.attention import LocalWindow, packed_attention_mask
from s2sjax.model.config import AroundDecoder, ConfigError, ModelConfig

NAME = "mimo_audio"  # model_config.json's `family` (s2sjax/scoring/architectures/mimo_audio.py registers it)
Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class MimoAudioConfig(AroundDecoder):
  """MiMo-Audio's architecture (hashable: a static argument of `jax.jit`), parsed from a release's config.json and
  its tokenizer's special ids by `s2sjax.scoring.architectures.mimo_audio.parse_config`."""

  decoder: ModelConfig  # the global stack: embed_tokens, layers, final norm, lm_head (the text head)
  input_local: ModelConfig  # input_local_transformer: its layers and final norm (no embedding, no head)
  local: ModelConfig  # local_transformer (the patch decoder): its layers and final norm
  group_size: int  # frames per patch
  speech_vocab_sizes: tuple[int, ...]  # rows of each channel's speech table and head (the empty id included)
  empty_codes: tuple[int, ...]  # speech_zeroemb_idx: each channel's empty id
  delays: tuple[int, ...]  # delay_pattern: the patch decoder's step offset of each channel
  empty_id: int  # <|empty|>: the text id of a speech patch
  input_full_attention: bool  # the input local transformer attends both ways within a patch
  family: str = NAME

  def __post_init__(self):
    problems = [] if self.family == NAME else [f"family {self.family!r} is not {NAME!r}"]
    channels = len(self.speech_vocab_sizes)
    if not channels or len(self.empty_codes) != channels or len(self.delays) != channels:
      problems.append(f"speech_vocab_size ({len(self.speech_vocab_sizes)}), speech_zeroemb_idx "
                      f"({len(self.empty_codes)}) and delay_pattern ({len(self.delays)}) must each name every channel")
    problems += [f"channel {c}'s empty id {e} is outside its {n} rows" for c, (n, e) in
                 enumerate(zip(self.speech_vocab_sizes, self.empty_codes)) if not 0 <= e < n]
    if any(d < 0 for d in self.delays):
      problems.append(f"delay_pattern {self.delays} holds a negative delay")
    if not 0 <= self.empty_id < self.decoder.vocab_size:
      problems.append(f"<|empty|> id {self.empty_id} is outside the {self.decoder.vocab_size}-row text table")
    if self.group_size < 1:
      problems.append(f"group_size={self.group_size}")
    if problems:
      raise ConfigError("MiMo-Audio config: " + "; ".join(problems))

  @property
  def channels(self) -> int:
    return len(self.speech_vocab_sizes)

  @property
  def local_steps(self) -> int:
    """The patch decoder's steps: every channel's frames, the last channel `max(delays)` steps late (:431)."""
    return self.group_size + max(self.delays)

  @property
  def projects_speech_to_local(self) -> bool:
    """speech_embeddings_to_local exists when the tables are narrower or wider than the patch decoder (:284-291)."""
    return self.input_local.hidden_size != self.local.hidden_size

  def num_params(self) -> int:
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(abstract_params(self))))

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "MimoAudioConfig":
    fields = json.loads(text)  # a key missing or unknown: the dataclass's own KeyError / TypeError
    stacks = {name: ModelConfig.from_json(json.dumps(fields[name])) for name in ("decoder", "input_local", "local")}
    tuples = {name: tuple(fields[name]) for name in ("speech_vocab_sizes", "empty_codes", "delays")}
    return cls(**dict(fields, **stacks, **tuples))


def _stack(tree: Params) -> Params:
  """A Qwen2Model without embeddings or head (the two local transformers): its layers and final norm."""
  return {"layers": tree["layers"], "final_norm": tree["final_norm"]}


def _assemble(global_tree: Params, input_local: Params, local: Params, tables: Params) -> Params:
  return {**global_tree, "input_local": _stack(input_local), "local": _stack(local), **tables}


def _table_shapes(config: MimoAudioConfig, param_dtype) -> Params:
  d_in, d_local, d = config.input_local.hidden_size, config.local.hidden_size, config.decoder.hidden_size
  leaf = lambda *shape: jax.ShapeDtypeStruct(shape, param_dtype)
  tables = {
    "speech_embed": {str(c): {"embedding": leaf(n, d_in)} for c, n in enumerate(config.speech_vocab_sizes)},
    "local_heads": {str(c): {"kernel": leaf(d_local, n)} for c, n in enumerate(config.speech_vocab_sizes)},
    "speech_group_downcast": {"kernel": leaf(config.group_size * d_in, d)},
    "hidden_states_downcast": {"kernel": leaf(d, d_local)},
  }
  if config.projects_speech_to_local:
    tables["speech_to_local"] = {"kernel": leaf(d_in, d_local)}
  return tables


def _table_axes(config: MimoAudioConfig) -> Params:
  axes = {
    "speech_embed": {str(c): {"embedding": PartitionSpec("audio_vocab", "embed")} for c in range(config.channels)},
    "local_heads": {str(c): {"kernel": PartitionSpec("embed", "audio_vocab")} for c in range(config.channels)},
    "speech_group_downcast": {"kernel": PartitionSpec("mlp", "embed")},
    "hidden_states_downcast": {"kernel": PartitionSpec("embed", "mlp")},
  }
  if config.projects_speech_to_local:
    axes["speech_to_local"] = {"kernel": PartitionSpec("mlp", "embed")}
  return axes


def abstract_params(config: MimoAudioConfig, param_dtype=jnp.float32) -> Params:
  """The parameter tree as `jax.ShapeDtypeStruct`s: the shared decoder's tree for the global stack, `input_local`
  and `local` (each `layers` stacked and `final_norm`), the per-channel speech tables and heads, the downcasts."""
  return _assemble(decoder.abstract_params(config.decoder, param_dtype),
                   decoder.abstract_params(config.input_local, param_dtype),
                   decoder.abstract_params(config.local, param_dtype), _table_shapes(config, param_dtype))


def param_logical_axes(config: MimoAudioConfig) -> Params:
  return _assemble(decoder.param_logical_axes(config.decoder), decoder.param_logical_axes(config.input_local),
                   decoder.param_logical_axes(config.local), _table_axes(config))


# ---- the forward: pure functions of (config, params, arrays) ---------------------------------------------------------


def _precision(dtype) -> jax.lax.Precision:
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


def _dense(x, kernel, dtype):
  return jnp.einsum("...i,io->...o", x.astype(dtype), kernel.astype(dtype), precision=_precision(dtype))


def _round_bf16(x):
  """x's values rounded to bfloat16 (nearest even), kept in x's dtype. `reduce_precision`, not a round trip through
  bfloat16: XLA may drop a convert pair inside a fused program (its excess-precision rewrite), and then leaves the
  value unrounded (in the scoring step, 14% of the input local transformer's normalised inputs, and a spoken
  candidate's log-probs up to 1.3e-4 off upstream's)."""
  return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def _layer(config: ModelConfig, dtype, attention: str = "xla", window=None) -> decoder.DecoderLayer:
  return decoder.DecoderLayer(config, dtype, dtype, attention, window)


def _run_layers(layer: decoder.DecoderLayer, stacked: Params, first: int, x, cos, sin, mask, segment_ids=None,
                branch_ids=None):
  """Layers first.. of a stacked tree, one `lax.scan` reading each layer's slice of the stack in place."""
  count = jax.tree.leaves(stacked)[0].shape[0]
  if count <= first:
    return x

  def body(h, index):
    params = jax.tree.map(lambda leaf: jax.lax.dynamic_index_in_dim(leaf, index, keepdims=False), stacked)
    return layer.apply({"params": params}, h, cos, sin, mask, segment_ids, branch_ids)[0], None

  return jax.lax.scan(body, x, jnp.arange(first, count))[0]


def speech_sum(config: MimoAudioConfig, params: Params, codes: jax.Array, dtype=jnp.float32) -> jax.Array:
  """[..., group, d_in] the channels' speech embeddings summed (codes [..., group, channels]): each empty code
  contributes zero, and the running sum is rounded to bfloat16 after each channel, in channel order (:349-370)."""
  total = jnp.zeros(codes.shape[:-1] + (config.input_local.hidden_size,), dtype)
  for c, empty in enumerate(config.empty_codes):
    row = jnp.take(params["speech_embed"][str(c)]["embedding"], codes[..., c], axis=0).astype(dtype)
    total = _round_bf16(total + jnp.where((codes[..., c] == empty)[..., None], 0, row))
  return total


def input_local(config: MimoAudioConfig, params: Params, speech: jax.Array, dtype=jnp.float32) -> jax.Array:
  """The input local transformer over each patch's frames: speech [N, group, d_in] (bf16 values) -> [N, group, d_in]
  after its final norm. Attention within the patch, both ways when input_full_attention (upstream's is_causal=False
  to SDPA, :319); rotary cos/sin rounded to bfloat16 and layer 0's normalised input too (the bf16 input's dtype)."""
  c = config.input_local
  n, group = speech.shape[:2]
  positions = jnp.broadcast_to(jnp.arange(group), (n, group))
  cos, sin = (_round_bf16(t) for t in rotary.rotary_angles(positions, c.rotary_dim, c.rope_theta))
  full = jnp.ones((n, group, group), bool)
  mask = full if config.input_full_attention else jnp.tril(full)
  stack = params["input_local"]
  first = jax.tree.map(lambda leaf: leaf[0], stack["layers"])
  # layer 0 by its parts: its input norm returns weight * (normalised x rounded to bf16)
  normed = _round_bf16(norms.rms_norm(speech, jnp.ones((c.hidden_size,), dtype), c.rms_norm_eps))
  normed = normed * first["attn_norm"]["scale"].astype(dtype)
  attention = decoder.Attention(c, dtype, dtype)
  h = speech + attention.apply({"params": first["attn"]}, normed, cos, sin, mask, None, None)
  mlp_in = norms.rms_norm(h, first["mlp_norm"]["scale"].astype(dtype), c.rms_norm_eps)
  h = h + decoder.Mlp(c, dtype, dtype).apply({"params": first["mlp"]}, mlp_in)
  h = _run_layers(_layer(c, dtype), stack["layers"], 1, h, cos, sin, mask)
  return norms.rms_norm(h, stack["final_norm"]["scale"].astype(dtype), c.rms_norm_eps)


def embed_patches(config: MimoAudioConfig, params: Params, text_ids: jax.Array, codes: jax.Array,
                  dtype=jnp.float32) -> dict[str, jax.Array]:
  """The global stack's inputs: text_ids [B, T] (each patch's slot-0 text id), codes [B, T, group, channels] ->
  {"input_local_in" [B, T, group, d_in], "input_local_out" (before the speech mask), "speech_downcast" [B, T, H],
  "inputs" [B, T, H]} (_prepare_input_embeds, :331-387)."""
  batch, length, group = codes.shape[:3]
  is_speech = (text_ids == config.empty_id)[..., None, None]
  local_in = jnp.where(is_speech, speech_sum(config, params, codes, dtype), 0)
  local_out = input_local(config, params, local_in.reshape(batch * length, group, -1), dtype).reshape(local_in.shape)
  grouped = jnp.where(is_speech, local_out, 0).reshape(batch, length, -1)
  downcast = _dense(grouped, params["speech_group_downcast"]["kernel"], dtype)
  text = jnp.take(params["embed"]["embedding"], text_ids, axis=0).astype(dtype)
  text = jnp.where(is_speech[..., 0], 0, text)
  return {"input_local_in": local_in, "input_local_out": local_out, "speech_downcast": downcast,
          "inputs": text + downcast}


def global_hidden(config: MimoAudioConfig, params: Params, inputs: jax.Array, positions: jax.Array, mask,
                  segment_ids=None, branch_ids=None, *, dtype=jnp.float32, attention: str = "xla",
                  window: LocalWindow | None = None) -> jax.Array:
  """[B, T, H] the global stack's final-normed hidden states over patch inputs [B, T, H] (the decoder's masks:
  packed rows, a prefix shared by its candidates, item-local windows)."""
  c = config.decoder
  cos, sin = rotary.rotary_angles(positions, c.rotary_dim, c.rope_theta)
  h = _run_layers(_layer(c, dtype, attention, window), params["layers"], 0, inputs, cos, sin, mask, segment_ids,
                  branch_ids)
  return norms.rms_norm(h, params["final_norm"]["scale"].astype(dtype), c.rms_norm_eps)


def text_logits(params: Params, hidden: jax.Array) -> jax.Array:
  """fp32 text-head logits over the full vocabulary for final-normed global hidden states [..., H]."""
  dtype = hidden.dtype
  return _dense(hidden, params["lm_head"]["kernel"], dtype).astype(jnp.float32)


def local_schedule(config: MimoAudioConfig) -> np.ndarray:
  """int [steps, channels]: the frame channel c predicts at patch-decoder step t, -1 where it is idle (:452-458)."""
  steps = np.arange(config.local_steps)[:, None] - np.asarray(config.delays)[None, :]
  return np.where((steps >= 0) & (steps < config.group_size), steps, -1)


def local_log_probs(config: MimoAudioConfig, params: Params, hidden: jax.Array, codes: jax.Array,
                    dtype=jnp.float32) -> tuple[list[jax.Array], jax.Array]:
  """The patch decoder teacher-forced: hidden [N, H] final-normed global states, each predicting the patch whose
  codes are codes [N, group, channels]. Returns (per channel c fp32 log-softmax [N, group, vocab_c] of frame f's
  code, its full head included, local hidden [N, steps, d_local]). Step 0 reads hidden_states_downcast(hidden),
  step t + 1 the sum of the speech embeddings of the codes the active channels take at step t (:441-474)."""
  schedule = local_schedule(config)
  first = _dense(hidden, params["hidden_states_downcast"]["kernel"], dtype)
  steps = [first]
  for t in range(config.local_steps - 1):
    total = jnp.zeros_like(first)
    for c, frame in enumerate(schedule[t]):
      if frame < 0:
        continue
      row = jnp.take(params["speech_embed"][str(c)]["embedding"], codes[:, frame, c], axis=0).astype(dtype)
      if config.projects_speech_to_local:
        row = _dense(row, params["speech_to_local"]["kernel"], dtype)
      total = total + row
    steps.append(total)
  x = jnp.stack(steps, axis=1)  # [N, steps, d_local]
  c = config.local
  n, length = x.shape[:2]
  positions = jnp.broadcast_to(jnp.arange(length), (n, length))
  cos, sin = rotary.rotary_angles(positions, c.rotary_dim, c.rope_theta)
  mask = jnp.tril(jnp.ones((n, length, length), bool))
  h = _run_layers(_layer(c, dtype), params["local"]["layers"], 0, x, cos, sin, mask)
  h = norms.rms_norm(h, params["local"]["final_norm"]["scale"].astype(dtype), c.rms_norm_eps)
  out = []
  for channel, delay in enumerate(config.delays):
    at = h[:, delay:delay + config.group_size]  # step delay + f predicts frame f
    logits = _dense(at, params["local_heads"][str(channel)]["kernel"], dtype).astype(jnp.float32)
    out.append(jax.nn.log_softmax(logits, -1))
  return out, h


def patch_nll(config: MimoAudioConfig, params: Params, hidden: jax.Array, codes: jax.Array, dtype=jnp.float32
              ) -> jax.Array:
  """[N, channels] each channel's NLL of a patch, summed over its frames: codes [N, group, channels] under the
  patch decoder read from hidden [N, H] (`local_log_probs`, the full head's softmax, empty id included)."""
  log_probs, _ = local_log_probs(config, params, hidden, codes, dtype)
  return jnp.stack([-jnp.take_along_axis(lp, codes[..., c, None], axis=-1)[..., 0].sum(-1)
                    for c, lp in enumerate(log_probs)], axis=-1)


@functools.partial(jax.jit, static_argnums=0)
def _sequence(config: MimoAudioConfig, params: Params, text_ids, codes):
  length = text_ids.shape[1]
  embedded = embed_patches(config, params, text_ids, codes)
  positions = jnp.arange(length)[None]
  mask = packed_attention_mask(jnp.ones((1, length), jnp.int32))
  hidden = global_hidden(config, params, embedded["inputs"], positions, mask)
  local, local_hidden = local_log_probs(config, params, hidden[0, :-1], codes[0, 1:])
  return dict(embedded, hidden=hidden, text=jax.nn.log_softmax(text_logits(params, hidden), -1), local=local,
              local_hidden=local_hidden)


def split_input_ids(config: MimoAudioConfig, input_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Upstream's input_ids [1 + channels, group * T] -> (text ids [T] from each patch's slot 0, codes [T, group,
  channels]) as the model reads them (:340-345)."""
  ids = np.asarray(input_ids)
  group = config.group_size
  text = ids[0, ::group]
  codes = ids[1:].reshape(config.channels, -1, group).transpose(1, 2, 0)
  return text, codes


def sequence_outputs(config: MimoAudioConfig, params: Params, text_ids: np.ndarray, codes: np.ndarray) -> dict:
  """Every stage of one plain sequence of patches (positions arange, causal), as numpy: "input_local_in",
  "input_local_out", "speech_downcast", "inputs", "hidden" [T, ...]; "text" the text head's fp32 log-softmax
  [T, vocab] after every patch; "local" per channel [T - 1, group, vocab_c]: patch g + 1's codes under the patch
  decoder read from patch g; "local_hidden" [T - 1, steps, d_local]."""
  out = _sequence(config, params, jnp.asarray(text_ids, jnp.int32)[None], jnp.asarray(codes, jnp.int32)[None])
  local = [np.asarray(x) for x in out.pop("local")]
  squeezed = {k: np.asarray(v)[0] for k, v in out.items() if k != "local_hidden"}
  return dict(squeezed, local=local, local_hidden=np.asarray(out["local_hidden"]))
