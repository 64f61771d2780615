"""Whisper's log-mel features, the input of both Whisper-based speech tokenizers (GLM-4-Voice's WhisperVQ and
Baichuan-Audio's encoder), computed on the host in numpy without torch.

The rule is transformers' `WhisperFeatureExtractor` (torch path): a periodic Hann STFT centred with reflect padding,
the power spectrum without its last frame, slaney mel filters, log10 clamped at 1e-10, floored at 8 below the
maximum, then (x + 4) / 4. How the wave is padded first is each model's own rule and the caller's job.
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
                    sample_rate: int = 16000) -> np.ndarray:
  """float32 [n_mels, len(wave) // hop]: Whisper's normalised log-mel of the (already padded) wave."""
  mel = power_spectrum(wave, n_fft, hop) @ mel_filters(n_mels, n_fft, sample_rate)
  log_mel = np.log10(np.maximum(mel, 1e-10))
  log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
  return ((log_mel + 4.0) / 4.0).T.astype(np.float32)
