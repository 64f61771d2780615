"""GLM-4-Voice's speech tokenizer (WhisperVQ, THUDM/glm-4-voice-tokenizer) in JAX: 16 kHz audio -> one stream of
12.5 Hz codes, as upstream `speech_tokenizer/utils.py` extract_speech_token computes them with `WhisperVQEncoder`
(`speech_tokenizer/modeling_whisper.py`, THUDM/GLM-4-Voice eb00ce9).

The path: Whisper log-mel of the segment zero-padded to a multiple of 1280 samples; two causal convolutions (the
second of stride 2) with gelu; sinusoidal positions; the first `quantize_position` Whisper encoder layers under a
block-causal attention mask; average pooling by 4; the index of the nearest codebook vector.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import numpy as np

from s2sjax.runtime.errors import UserError
from tasks.audio import whisper
from tasks.audio.jax_tokenizer import JaxAudioTokenizer
from tasks.audio.ops import conv1d, matmul_precision, nearest
from tasks.audio.weights import ReleaseWeights, read_json
from tasks.audio.whisper import whisper_log_mel

# utils.py l.60-65: audio is cut into 30 s pieces, each tokenized alone, their tokens concatenated.
SEGMENT_SECONDS = 30
SAMPLE_RATE = 16000
# utils.py l.21-23: a training checkpoint (WhisperVQForConditionalGeneration) keeps the encoder under this prefix.
TRAINING_PREFIX = "model.encoder."
CONV_KERNEL = 3
CONV_STRIDES = (1, 2)  # conv1, conv2 (modeling_whisper.py l.1080-1081)


class Glm4VoiceError(UserError, ValueError):
  """A release folder this port cannot read or does not implement: names the file and the key or setting."""


@dataclasses.dataclass(frozen=True)
class WhisperVQShape:
  """What of config.json and preprocessor_config.json determines the codes."""

  d_model: int
  heads: int
  ffn: int
  layers: int  # quantize_position: only these layers run before the quantizer
  n_mels: int
  max_positions: int
  block_size: int | None  # quantize_causal_block_size, in frames after the stride-2 convolution
  pooling_kernel: int
  pooling_type: str
  codebook_size: int
  n_fft: int
  hop: int
  padding_value: float

  @property
  def frames_per_code(self) -> int:
    return math.prod(CONV_STRIDES) * self.pooling_kernel

  @property
  def pad_to_samples(self) -> int:
    # utils.py l.67-73: the feature extractor pads to a multiple of conv strides x pooling x hop (1280), not to 30 s
    return self.frames_per_code * self.hop


def read_shape(model_dir: str) -> WhisperVQShape:
  """The release's config, with every switch this port does not implement refused by name. Missing switches take
  WhisperVQConfig's defaults (configuration_whisper.py l.5-21), as from_pretrained gives them. Two settings do not
  reach the codes: quantize_encoder_only (the layers past quantize_position run after the quantizer) and
  scale_embedding (the encoder computes embed_scale but never applies it, modeling_whisper.py l.1075)."""
  config_path = os.path.join(model_dir, "config.json")
  config = read_json(config_path, Glm4VoiceError)
  preprocessor_path = os.path.join(model_dir, "preprocessor_config.json")
  preprocessor = read_json(preprocessor_path, Glm4VoiceError)

  def need(table: dict, path: str, key: str):
    if table.get(key) is None:
      raise Glm4VoiceError(f"{path} has no {key!r}")
    return table[key]

  def refuse(key: str, value, implemented: str):
    raise Glm4VoiceError(f"{config_path}: {key}={value!r} is not implemented (this port implements {implemented})")

  if not config.get("encoder_causal_convolution", False):
    refuse("encoder_causal_convolution", config.get("encoder_causal_convolution", False), "true")
  for key in ("encoder_causal_attention", "quantize_causal_encoder"):
    if config.get(key, False):
      refuse(key, config[key], "false: the block-causal mask over valid frames")
  if config.get("pooling_type", "max") not in ("avg", "max"):
    refuse("pooling_type", config["pooling_type"], "avg, max")
  kernel = config.get("pooling_kernel_size")
  if not isinstance(kernel, int) or kernel < 1:
    refuse("pooling_kernel_size", kernel, "a positive integer")
  quantize_position = config.get("quantize_position", 16)
  if config.get("pooling_position", 0) != quantize_position:
    refuse("pooling_position", config.get("pooling_position", 0),
           f"pooling right before the quantizer: pooling_position = quantize_position = {quantize_position}")
  if config.get("activation_function", "gelu") != "gelu":
    refuse("activation_function", config["activation_function"], "gelu")
  block = config.get("quantize_causal_block_size")
  if block is not None and (not isinstance(block, int) or block < 1):
    refuse("quantize_causal_block_size", block, "a positive integer or null")

  if preprocessor.get("feature_extractor_type", "WhisperFeatureExtractor") != "WhisperFeatureExtractor":
    raise Glm4VoiceError(f"{preprocessor_path}: feature_extractor_type={preprocessor['feature_extractor_type']!r} "
                         "is not implemented (WhisperFeatureExtractor)")
  if need(preprocessor, preprocessor_path, "sampling_rate") != SAMPLE_RATE:
    raise Glm4VoiceError(f"{preprocessor_path}: sampling_rate={preprocessor['sampling_rate']} — "
                         f"extract_speech_token feeds {SAMPLE_RATE} Hz audio")
  n_mels = need(config, config_path, "num_mel_bins")
  if need(preprocessor, preprocessor_path, "feature_size") != n_mels:
    raise Glm4VoiceError(f"{preprocessor_path}: feature_size={preprocessor['feature_size']} but {config_path} "
                         f"has num_mel_bins={n_mels}")
  hop = need(preprocessor, preprocessor_path, "hop_length")
  max_positions = need(config, config_path, "max_source_positions")
  if max_positions * math.prod(CONV_STRIDES) * hop < SEGMENT_SECONDS * SAMPLE_RATE:
    raise Glm4VoiceError(f"{config_path}: max_source_positions={max_positions} does not cover a {SEGMENT_SECONDS} s "
                         "segment (upstream's position table would be too short for it)")
  d_model, heads = need(config, config_path, "d_model"), need(config, config_path, "encoder_attention_heads")
  if d_model % heads:
    raise Glm4VoiceError(f"{config_path}: d_model={d_model} is not a multiple of encoder_attention_heads={heads}")
  return WhisperVQShape(
      d_model=d_model, heads=heads, ffn=need(config, config_path, "encoder_ffn_dim"), layers=quantize_position,
      n_mels=n_mels, max_positions=max_positions, block_size=block,
      pooling_kernel=kernel, pooling_type=config.get("pooling_type", "max"),
      codebook_size=need(config, config_path, "quantize_vocab_size"),
      n_fft=need(preprocessor, preprocessor_path, "n_fft"), hop=hop,
      padding_value=float(preprocessor.get("padding_value", 0.0)))


def open_weights(model_dir: str) -> ReleaseWeights:
  """The encoder's tensors: unprefixed as WhisperVQEncoder.save_pretrained writes them (the release), or under
  `model.encoder.` as in a training checkpoint (utils.py load_quantize_encoder strips it)."""
  weights = ReleaseWeights(model_dir)
  if not weights.has("conv1.weight") and weights.has(TRAINING_PREFIX + "conv1.weight"):
    return ReleaseWeights(model_dir, TRAINING_PREFIX)
  return weights


def read_params(weights: ReleaseWeights, shape: WhisperVQShape) -> dict:
  """float32 arrays laid for the forward: conv kernels [width, in, out], linear kernels [in, out]."""
  d, f = shape.d_model, shape.ffn
  conv = lambda name, c_in: {"kernel": weights.take(f"{name}.weight", (d, c_in, CONV_KERNEL)).transpose(2, 1, 0),
                             "bias": weights.take(f"{name}.bias", (d,))}

  layers = [whisper.read_layer(weights, f"layers.{i}", d, f) for i in range(shape.layers)]
  return {"conv1": conv("conv1", shape.n_mels), "conv2": conv("conv2", d),
          "positions": weights.take("embed_positions.weight", (shape.max_positions, d)),
          "layers": layers, "codebook": weights.take("codebook.weight", (shape.codebook_size, d))}


# ---- the forward: pure functions of (params, arrays) ----------------------------------------------------------


def causal_conv(x, params, stride: int, precision):
  """CausalConv1d (modeling_whisper.py l.91-121): kernel-1 zeros on the left only (the padding=1 it is built with
  is dropped), so an output frame reads its own and earlier input frames."""
  return conv1d(x, params, stride, padding=((params["kernel"].shape[0] - 1, 0),), precision=precision)


def block_causal_visibility(key_valid, block_size: int | None):
  """[B, T, T] bool, query i sees key j (modeling_whisper.py l.1150-1166): tril OR same block, AND the key is a
  valid frame. "j <= i or j in i's block" is "j's block <= i's block". Without a block size upstream uses the
  plain key mask (get_extended_attention_mask)."""
  import jax.numpy as jnp

  if block_size is None:
    return jnp.broadcast_to(key_valid[:, None, :], key_valid.shape[:1] + key_valid.shape[1:] * 2)
  block = jnp.arange(key_valid.shape[1]) // block_size
  return (block[None, :] <= block[:, None])[None] & key_valid[:, None, :]


def pool(x, kernel: int, kind: str):
  """AvgPool1d / MaxPool1d over time after right zero-padding to a multiple of `kernel` (modeling_whisper.py
  l.1275-1280)."""
  import jax.numpy as jnp

  batch, frames, d_model = x.shape
  x = jnp.pad(x, ((0, 0), (0, -frames % kernel), (0, 0)))
  windows = x.reshape(batch, -1, kernel, d_model)
  return windows.mean(2) if kind == "avg" else windows.max(2)


def forward(params, shape: WhisperVQShape, mel, mel_valid, with_intermediates: bool = False):
  """codes int32 [B, T / frames_per_code] of mel [B, T, n_mels] (T a multiple of frames_per_code) whose valid
  frames are `mel_valid` [B, T]; with `with_intermediates`, also the layer-0 input, each layer's output and the
  pooled pre-quantizer states (all frames, padding included, as upstream computes them).

  Batch invariance, frame by frame. A row's frames between its valid end and its own length (a multiple of
  frames_per_code: the mel of the zero-padded audio, as the solo upstream call computes it) are real inputs, as
  upstream has them: they feed the convolutions, their hidden states are computed, never zeroed, and pooled into the
  row's last codes; they are masked only as attention keys. Frames past the row's own length (a batch's padding,
  valid = 0) reach none of its kept codes: the convolutions are causal, those frames are masked keys, and every
  kept code's pooling window ends at or before the row's own length.
  """
  import jax
  import jax.numpy as jnp

  precision = matmul_precision(params["conv1"]["kernel"].dtype)
  x = jax.nn.gelu(causal_conv(mel, params["conv1"], CONV_STRIDES[0], precision), approximate=False)
  x = jax.nn.gelu(causal_conv(x, params["conv2"], CONV_STRIDES[1], precision), approximate=False)
  frames = x.shape[1]
  positions = params["positions"]
  if frames > positions.shape[0]:
    # Only a runner's bucket padding reaches past the table (a 30 s segment is 1500 frames): those frames lie past
    # every row's own features, so no kept code reads them (causal convs, masked keys, pooling windows).
    positions = jnp.pad(positions, ((0, frames - positions.shape[0]), (0, 0)))
  x = x + positions[:frames].astype(x.dtype)
  visible = block_causal_visibility(mel_valid[:, :: CONV_STRIDES[0] * CONV_STRIDES[1]], shape.block_size)
  layer0_input, layer_outputs = x, []
  for layer in params["layers"]:
    x = whisper.encoder_layer(x, layer, visible, shape.heads, precision)
    layer_outputs.append(x)
  pooled = pool(x, shape.pooling_kernel, shape.pooling_type)
  codes = nearest(pooled, params["codebook"])  # vector_quantize, modeling_whisper.py l.68-82
  if with_intermediates:
    return codes, {"layer0_input": layer0_input, "layer_outputs": layer_outputs, "prequant": pooled}
  return codes


@functools.lru_cache(maxsize=None)
def _jitted_forward():
  """`forward` jitted once per process: tokenizers of the same shape share its compilations."""
  import jax

  return jax.jit(forward, static_argnums=(1, 4))


class Glm4VoiceTokenizer(JaxAudioTokenizer):
  """GLM-4-Voice's `<|audio_N|>` units from a release folder (config.json, preprocessor_config.json,
  model.safetensors) as THUDM/glm-4-voice-tokenizer ships it.

  Features of a segment are exactly what the upstream call on that segment alone feeds the encoder: its mel padded
  to its own multiple of 1280 samples, plus one channel marking the valid frames (the feature extractor's
  attention mask). The runner's further zero frames carry a 0 there and, behind causal convolutions, reach no kept
  code: a row's codes are the solo call's, whatever shares its batch. (Upstream's own batched call can differ from
  its solo call where a wave ends less than 41 samples before a multiple of 1280: there the solo STFT's last frame
  reflects real samples, the batched one reads zeros. The oracle's joint and solo runs agree.)
  """

  sample_rate = SAMPLE_RATE
  num_codebooks = 1
  segment_samples = SEGMENT_SECONDS * SAMPLE_RATE

  def __init__(self, model_dir: str, dtype: str = "float32"):
    if not os.path.isdir(model_dir):
      raise Glm4VoiceError(f"GLM-4-Voice tokenizer folder {model_dir} does not exist")
    self.model_dir = model_dir
    self.shape = read_shape(model_dir)
    weights = open_weights(model_dir)
    self.params = read_params(weights, self.shape)
    self.weights_sha = weights.fingerprint()
    self.codebook_sizes = (self.shape.codebook_size,)
    self.frame_rate = SAMPLE_RATE / self.shape.pad_to_samples
    self.time_multiple = self.shape.frames_per_code  # pooling windows start at multiples of it in every row
    self.attention_heads, self.attention_stride = self.shape.heads, math.prod(CONV_STRIDES)
    self.frame_bytes = whisper.frame_bytes(self.shape.d_model, self.shape.ffn, math.prod(CONV_STRIDES))
    self.configure(dtype=dtype)

  @classmethod
  def from_settings(cls, settings: dict, where) -> "Glm4VoiceTokenizer":
    return cls(where(settings.get("model_dir", ".")), settings.get("dtype", "float32"))

  def prepare(self, segment: np.ndarray) -> tuple[np.ndarray, int]:
    shape = self.shape
    samples = len(segment)
    if samples == 0:  # utils.py l.61: empty audio makes no segment, hence no tokens
      return np.zeros((0, shape.n_mels + 1), np.float32), 0
    padded = np.full(-(-samples // shape.pad_to_samples) * shape.pad_to_samples, shape.padding_value, np.float32)
    padded[:samples] = segment
    mel = whisper_log_mel(padded, n_mels=shape.n_mels, n_fft=shape.n_fft, hop=shape.hop, sample_rate=SAMPLE_RATE)
    # WhisperFeatureExtractor's frame mask = the sample mask taken every hop: frame f is valid when f*hop < samples
    valid = np.arange(mel.shape[1]) * shape.hop < samples
    features = np.concatenate([mel.T, valid[:, None].astype(np.float32)], axis=1)
    # utils.py l.77-78: the kept tokens are the mask taken every conv stride, then every pooling window
    return features, -(-int(valid.sum()) // shape.frames_per_code)

  def apply(self, params, features, lengths):
    # `lengths` is not needed: the valid-frame channel marks the keys, and the frames past a row's own features
    # reach none of its kept codes (see forward)
    mel, valid = features[..., : self.shape.n_mels], features[..., self.shape.n_mels] > 0.5
    return forward(params, self.shape, mel, valid)[..., None]

  def intermediates(self, segments: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The segments in one zero-padded batch, as the runner lays them; for each, cut to its own frames: its features
    ("mel" [n_mels, T], "mel_valid" [T]), "layer0_input" and "layer{i}_output" [T / 2, d_model], "prequant"
    [T / 8, d_model] (every frame upstream computes, padding included) and the kept "codes" [n_codes]."""
    import jax

    prepared = [self.prepare(segment) for segment in segments]
    longest = max(len(features) for features, _ in prepared)
    batch = np.zeros((len(prepared), -(-longest // self.time_multiple) * self.time_multiple, self.shape.n_mels + 1),
                     np.float32)
    for row, (features, _) in enumerate(prepared):
      batch[row, : len(features)] = features
    codes, states = _jitted_forward()(self.params, self.shape, batch[..., : self.shape.n_mels],
                                      batch[..., self.shape.n_mels] > 0.5, True)
    codes, states = np.asarray(codes), jax.tree_util.tree_map(np.asarray, states)
    out = []
    for row, (features, n_codes) in enumerate(prepared):
      frames = len(features) // math.prod(CONV_STRIDES)
      cut = {"mel": features[:, : self.shape.n_mels].T, "mel_valid": features[:, self.shape.n_mels].astype(np.int32),
             "codes": codes[row, :n_codes], "layer0_input": states["layer0_input"][row, :frames],
             "prequant": states["prequant"][row, : frames // self.shape.pooling_kernel]}
      for i, layer_output in enumerate(states["layer_outputs"]):
        cut[f"layer{i}_output"] = layer_output[row, :frames]
      out.append(cut)
    return out

  def identity(self) -> dict:
    return {"type": "glm4_voice", **dataclasses.asdict(self.shape), "dtype": self.dtype,
            "weights_sha": self.weights_sha}
