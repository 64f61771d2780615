"""What both Whisper-based speech tokenizers (GLM-4-Voice's WhisperVQ, Baichuan-Audio's encoder) share: Whisper's
log-mel features, computed on the host in numpy without torch, and the Whisper encoder layer, read from a
release's tensors and run in JAX.

The features' rule is transformers' `WhisperFeatureExtractor` (torch path): a periodic Hann STFT centred with
reflect padding, the power spectrum without its last frame, slaney mel filters, log10 clamped at 1e-10, floored at
8 below the maximum, then (x + 4) / 4. How the wave is padded first is each model's own rule and the caller's job.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def mel_filters(n_mels: int, n_fft: int, sample_rate: int) -> np.ndarray:
  """[n_fft // 2 + 1, n_mels] slaney filters, as the Whisper feature extractor builds them."""
  from transformers.audio_utils import mel_filter_bank

  return mel_filter_bank(num_frequency_bins=1 + n_fft // 2, num_mel_filters=n_mels, min_frequency=0.0,
                         max_frequency=sample_rate / 2, sampling_rate=sample_rate, norm="slaney",
                         mel_scale="slaney").astype(np.float64)


def power_spectrum(wave: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
  """[len(wave) // hop, n_fft // 2 + 1] |STFT|^2: frames centred (reflect padding of n_fft // 2 each side), a
  periodic Hann window, and the last frame dropped as Whisper drops it."""
  if len(wave) <= n_fft // 2:
    raise ValueError(f"{len(wave)} samples are too few for a centred STFT of {n_fft} (reflect padding)")
  padded = np.pad(wave.astype(np.float64), n_fft // 2, mode="reflect")
  frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop][: len(wave) // hop]
  window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
  return np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2


def whisper_log_mel(wave: np.ndarray, n_mels: int = 128, n_fft: int = 400, hop: int = 160,
                    sample_rate: int = 16000, pad_to: int | None = None) -> np.ndarray:
  """float32 [n_mels, len(wave) // hop]: Whisper's normalised log-mel of the (already padded) wave.

  With `pad_to` (samples), the same as of the wave zero-padded to that length, [n_mels, pad_to // hop], with the
  STFT taken over the frames the wave reaches only: a frame of zeros has the mel floor (log10 of 1e-10) exactly,
  and enters the result only through the maximum."""
  frames = max(len(wave), pad_to or 0) // hop
  if pad_to is not None:
    # enough zeros that every frame touching the wave reads them, and the end's reflection reflects only zeros
    wave = np.pad(wave, (0, min(max(pad_to, len(wave)), -(-(len(wave) + n_fft) // hop) * hop) - len(wave)))
  mel = power_spectrum(wave, n_fft, hop) @ mel_filters(n_mels, n_fft, sample_rate)
  if len(mel) < frames:  # frames of zeros only
    mel = np.concatenate([mel, np.zeros((frames - len(mel), n_mels))])
  log_mel = np.log10(np.maximum(mel, 1e-10))
  log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
  return ((log_mel + 4.0) / 4.0).T.astype(np.float32)


def frame_bytes(d_model: int, ffn: int, stride: int) -> int:
  """Peak fp32 activation bytes per mel frame of a Whisper encoder (jax_tokenizer's `frame_bytes`): the first
  convolution's output, and an encoder layer's residual, norm, q, k, v, attended and MLP hidden at 1 / `stride`
  of the mel's rate."""
  return 4 * (d_model + (6 * d_model + ffn) // stride)


LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default: neither release sets another


# A layer's tensors as transformers' WhisperEncoderLayer names them; openai-whisper's ResidualAttentionBlock (the
# encoder Step-Audio 2 ships) names the same tensors otherwise.
HF_LAYER_NAMES = {"attention_norm": "self_attn_layer_norm", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
                  "v": "self_attn.v_proj", "out": "self_attn.out_proj", "mlp_norm": "final_layer_norm", "fc1": "fc1",
                  "fc2": "fc2"}
OPENAI_LAYER_NAMES = {"attention_norm": "attn_ln", "q": "attn.query", "k": "attn.key", "v": "attn.value",
                      "out": "attn.out", "mlp_norm": "mlp_ln", "fc1": "mlp.0", "fc2": "mlp.2"}


def read_layer(weights, key: str, d_model: int, ffn: int, names: dict[str, str] = HF_LAYER_NAMES) -> dict:
  """One encoder layer's tensors under `key` (`layers.3`), in `names`: pre-norm attention whose key projection has
  no bias, then a pre-norm gelu MLP. Kernels [in, out]."""
  from tasks.audio.jax_tokenizer import aligned

  norm = lambda name: {"scale": weights.take(f"{key}.{name}.weight", (d_model,)),
                       "bias": weights.take(f"{key}.{name}.bias", (d_model,))}

  def linear(name, n_in, n_out, bias=True):
    out = {"kernel": aligned(weights.take(f"{key}.{name}.weight", (n_out, n_in)).T)}  # XLA:CPU reads it in place
    if bias:
      out["bias"] = weights.take(f"{key}.{name}.bias", (n_out,))
    return out

  return {"attention_norm": norm(names["attention_norm"]), "q": linear(names["q"], d_model, d_model),
          "k": linear(names["k"], d_model, d_model, bias=False), "v": linear(names["v"], d_model, d_model),
          "out": linear(names["out"], d_model, d_model), "mlp_norm": norm(names["mlp_norm"]),
          "fc1": linear(names["fc1"], d_model, ffn), "fc2": linear(names["fc2"], ffn, d_model)}


def encoder_layer(x, params: dict, visible, heads: int, precision, rotary=None):
  """x [B, T, d] through one Whisper encoder layer; `visible` [B, T or 1, T] says which keys each query sees
  (`ops.attention`: an empty batch row stays finite). `rotary`: (cos, sin) [B, T, head_dim / 2] rotating q and k
  (rotate-half pairs), for encoders that place frames by RoPE instead of a position table (MiMo-Audio's)."""
  # jax loads here, not at import: the log-mel features above are numpy alone
  import jax

  from s2sjax.numerics.rotary import apply_rotary
  from s2sjax.numerics.norms import layer_norm
  from tasks.audio.ops import attention, dense

  batch, frames, width = x.shape
  norm = lambda y, p: layer_norm(y, p["scale"], p["bias"], LAYER_NORM_EPS)
  split = lambda y: y.reshape(batch, frames, heads, width // heads)
  h = norm(x, params["attention_norm"])
  q, k, v = (split(dense(h, params[name], precision)) for name in ("q", "k", "v"))
  if rotary is not None:
    q, k = (apply_rotary(y, *rotary, interleaved=False) for y in (q, k))
  attended = attention(q, k, v, visible, precision)
  x = x + dense(attended.reshape(batch, frames, width), params["out"], precision)
  hidden = jax.nn.gelu(dense(norm(x, params["mlp_norm"]), params["fc1"], precision), approximate=False)
  return x + dense(hidden, params["fc2"], precision)
