r"""Audio seconds tokenized per wall second: each JAX tokenizer at its release's real shapes (random weights) beside
a PyTorch forward of the same shapes and weights, each side in its own process, on the same machine.

  python -m s2sjax.benchmarks.audio_tokenizers [--tokenizers=glm4_voice,baichuan_audio,mimi,hubert_kmeans,kimi_whisper] \
      [--audio_seconds=60] [--output=bench_audio.json]

The references: transformers' `WhisperEncoderLayer`s under the causal convolutions, block mask, pooling and
codebook search for GLM-4-Voice; the same layers under Baichuan's convolutions, bridge and RVQ, written here;
transformers' `MimiModel.encode` and `HubertModel`; for Kimi-Audio's continuous features, transformers'
`WhisperEncoder` at whisper-large-v3's shapes. Per tokenizer, one process writes the release folder from the
torch modules (seeded), then the torch side and the JAX side each run in a process of their own: each loads its
model (torch builds the same seeded modules, JAX reads the folder), measures its framework's fp32 2048^2 matmul,
tokenizes the same recordings (the bundled sample's speech) once to warm up (JAX: compiles) and once timed, and
reports its peak resident memory while tokenizing (`PeakRss`: weights and every buffer, XLA's included). Both sides
start from the same host features. FLOPs are torch's count of the reference forward (XLA's cost analysis counts a
scanned layer once): on one 10.24 s segment, scaled to the recordings' seconds, or for Kimi-Audio, which pads every
wave to 30 s, one window times the windows. Each side's FLOP/s is those over its seconds, and its share of the
matmul rate its own process measured is printed beside it. Codes are compared frame by frame, features by their
largest difference; Kimi-Audio's lines under the table say what one utterance costs and what batching windows
across utterances gains. The printed table is what docs/benchmarks/README.md shows; `--output` keeps it as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from s2sjax.runtime import cli
from s2sjax.runtime.registry import load_object
from tasks import audio
from tasks.audio import kimi_whisper
from tasks.audio.base import load_audio
from tasks.sample import RELEASE_DIR

SAMPLE_SPEECH = os.path.join(RELEASE_DIR, "StoryCloze", "s-story-firstspeech")
BATCHED = 8  # Kimi-Audio's Whisper windows a step, measured beside one at a time
FLOP_SEGMENT_SECONDS = 10.24  # a multiple of every tokenizer's frame (1280 samples at 16 kHz, 1920 at 24 kHz)
MATMUL_SIZE = 2048
SIDES = ("torch", "jax")


def recordings(sample_rate: int, audio_seconds: float) -> list[np.ndarray]:
  """The bundled sample's spoken prefixes, in name order, until `audio_seconds` are gathered."""
  waves, total = [], 0.0
  for name in sorted(os.listdir(SAMPLE_SPEECH), key=lambda n: int(os.path.splitext(n)[0])):
    waves.append(load_audio(os.path.join(SAMPLE_SPEECH, name), sample_rate))
    total += len(waves[-1]) / sample_rate
    if total >= audio_seconds:
      break
  return waves


def timed(run) -> tuple[float, float, object]:
  """(wall seconds, this process's CPU seconds, the result): the CPU seconds read a run on a loaded machine."""
  start, cpu = time.perf_counter(), time.process_time()
  out = run()
  return time.perf_counter() - start, time.process_time() - cpu, out


class PeakRss:
  """The largest resident set this process reaches between `with` and its end, sampled every 5 ms on a thread
  (psutil): the model's weights, the framework's buffers (XLA's included, which tracemalloc does not see) and
  every temporary that lives longer than a sample."""

  def __enter__(self) -> "PeakRss":
    import threading

    import psutil

    process, self.bytes, self._stop = psutil.Process(), 0, threading.Event()

    def sample():
      while not self._stop.wait(0.005):
        self.bytes = max(self.bytes, process.memory_info().rss)

    self.bytes = process.memory_info().rss
    self._thread = threading.Thread(target=sample, daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()


def matmul_rate(kind: str, repeats: int = 5) -> float:
  """FLOP/s of one fp32 MATMUL_SIZE^2 matmul in this process, the best of `repeats`, through XLA or torch."""
  rng = np.random.default_rng(0)
  a, b = (rng.standard_normal((MATMUL_SIZE, MATMUL_SIZE)).astype(np.float32) for _ in range(2))
  if kind == "jax":
    import jax

    x, y = jax.device_put(a), jax.device_put(b)
    step = jax.jit(lambda x, y: jax.numpy.matmul(x, y, precision=jax.lax.Precision.HIGHEST))
    run = lambda: step(x, y).block_until_ready()
  else:
    import torch

    x, y = torch.from_numpy(a), torch.from_numpy(b)
    run = lambda: torch.matmul(x, y)
  run()
  best = min(timed(run)[0] for _ in range(repeats))
  return 2 * MATMUL_SIZE**3 / best


def counted_flops(run) -> float:
  """FLOPs of `run()` as torch executes it (FlopCounterMode: every matmul, convolution and attention). CPU
  attention runs as `_scaled_dot_product_flash_attention_for_cpu`, which torch's table leaves out (counted as 0),
  so it is counted here as the other attention kernels are."""
  import torch
  from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

  def cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)

  counter = FlopCounterMode(display=False, custom_mapping={
      torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention})
  with torch.no_grad(), counter:
    run()
  return counter.get_total_flops()


# ---- the references: torch forwards of the same shapes, and release folders holding their weights -------------


def _save(tensors: dict, path: str) -> None:
  from safetensors.numpy import save_file

  save_file({k: np.ascontiguousarray(v.detach().float().numpy()) for k, v in tensors.items()}, path)


def _whisper_layers(d_model: int, heads: int, ffn: int, layers: int):
  import torch
  from transformers import WhisperConfig
  from transformers.models.whisper.modeling_whisper import WhisperEncoderLayer

  config = WhisperConfig(d_model=d_model, encoder_attention_heads=heads, encoder_ffn_dim=ffn, encoder_layers=layers,
                         attn_implementation="sdpa")
  return torch.nn.ModuleList([WhisperEncoderLayer(config) for _ in range(layers)]).eval()


def _sinusoids(length: int, channels: int) -> "torch.Tensor":
  import torch

  scales = torch.exp(-np.log(10000) / (channels // 2 - 1) * torch.arange(channels // 2))
  angles = torch.arange(length)[:, None] * scales[None]
  return torch.cat([angles.sin(), angles.cos()], dim=1)


def _nearest(x, codebook):
  import torch

  return torch.cdist(x, codebook).argmin(-1)


class Reference:
  """A torch forward at a release's shapes, its random weights drawn from seed 0 (the same in every process), that
  `save`s them as that release's folder. The defaults below are a codes tokenizer's (a `JaxAudioTokenizer`):
  `__call__` maps one wave's host features to its codes, and the two sides' codes are compared frame by frame."""

  kind: str

  def save(self, folder: str) -> None:
    raise NotImplementedError

  @classmethod
  def jax_tokenizer(cls, folder: str):
    return load_object(audio.TOKENIZERS.get(cls.kind).loader)(folder)

  @staticmethod
  def encode(tokenizer, waves: list[np.ndarray]) -> list[np.ndarray]:
    """The JAX side's outputs for `waves`."""
    return tokenizer.encode_batch(waves)

  @staticmethod
  def host_features(tokenizer, wave: np.ndarray):
    """What this forward reads of one wave: the JAX tokenizer's own host features, so both sides start alike."""
    return tokenizer.prepare(wave)[0]

  def flops(self, tokenizer, waves: list[np.ndarray]) -> float:
    """FLOPs of this forward over `waves`: its count on one FLOP_SEGMENT_SECONDS segment, per second of that
    audio, times their seconds (the work grows with the audio)."""
    wave = np.random.default_rng(0).normal(0, 0.1, int(FLOP_SEGMENT_SECONDS * tokenizer.sample_rate))
    segment = counted_flops(lambda: self(self.host_features(tokenizer, wave.astype(np.float32))))
    return segment / FLOP_SEGMENT_SECONDS * sum(len(w) for w in waves) / tokenizer.sample_rate

  @staticmethod
  def jax_extras(tokenizer, waves: list[np.ndarray]) -> dict:
    """What the JAX side reports beside its timed run, measured after it."""
    return {"compile_seconds": round(tokenizer.runner.compile_seconds, 2)}

  @staticmethod
  def compare(ours: list[np.ndarray], theirs: list[np.ndarray]) -> dict:
    """The two sides' agreement over all waves: frames where every codebook is equal, over all frames."""
    equal = sum(int((a.reshape(len(a), -1)[: len(b)] == b.reshape(len(b), -1)[: len(a)]).all(-1).sum())
                for a, b in zip(ours, theirs))
    return {"codes_equal": f"{equal}/{sum(max(len(a), len(b)) for a, b in zip(ours, theirs))}"}

  @staticmethod
  def agreement(result: dict) -> str:
    """`compare`'s figures as the table's last column."""
    return result["codes_equal"]

  @staticmethod
  def notes(result: dict) -> tuple[dict, list[str]]:
    """Figures this tokenizer adds to its result, and the lines printed under the table that say them."""
    return {}, []


class Glm4VoiceReference(Reference):
  """GLM-4-Voice's tokenizer at the release's shapes: 16 layers of 1280 (of 32: the quantizer sits at 16), 20 heads,
  FFN 5120, causal convolutions, blocks of 200 frames, average pooling by 4, 16,384 codes."""

  kind = "glm4_voice"
  d, heads, ffn, layers, codes, block, pool = 1280, 20, 5120, 16, 16384, 200, 4

  def __init__(self):
    import torch

    torch.manual_seed(0)
    self.conv1, self.conv2 = torch.nn.Conv1d(128, self.d, 3), torch.nn.Conv1d(self.d, self.d, 3, stride=2)
    self.stack = _whisper_layers(self.d, self.heads, self.ffn, self.layers)
    self.positions = _sinusoids(1500, self.d)
    self.codebook = torch.randn(self.codes, self.d)

  def save(self, folder: str) -> None:
    tensors = {"conv1.weight": self.conv1.weight, "conv1.bias": self.conv1.bias, "conv2.weight": self.conv2.weight,
               "conv2.bias": self.conv2.bias, "embed_positions.weight": self.positions,
               "codebook.weight": self.codebook}
    for i, layer in enumerate(self.stack):
      tensors.update({f"layers.{i}.{k}": v for k, v in layer.state_dict().items()})
    _save(tensors, os.path.join(folder, "model.safetensors"))
    config = {"model_type": "whisper", "architectures": ["WhisperVQEncoder"], "d_model": self.d,
              "encoder_attention_heads": self.heads, "encoder_ffn_dim": self.ffn, "encoder_layers": 32,
              "num_mel_bins": 128, "max_source_positions": 1500, "activation_function": "gelu",
              "encoder_causal_convolution": True, "encoder_causal_attention": False, "quantize_causal_encoder": False,
              "quantize_causal_block_size": self.block, "quantize_position": self.layers,
              "pooling_position": self.layers, "pooling_type": "avg", "pooling_kernel_size": self.pool,
              "quantize_vocab_size": self.codes, "quantize_encoder_only": True}
    with open(os.path.join(folder, "config.json"), "w") as f:
      json.dump(config, f)
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
      json.dump({"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "hop_length": 160,
                 "n_fft": 400, "chunk_length": 30, "n_samples": 480000, "nb_max_frames": 3000,
                 "padding_side": "right", "padding_value": 0.0, "sampling_rate": 16000,
                 "return_attention_mask": False}, f)

  def __call__(self, features: np.ndarray) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    mel = torch.from_numpy(np.ascontiguousarray(features[:, :128].T))[None]
    valid = torch.from_numpy(features[::2, 128] > 0.5)  # the feature extractor's mask, at the conv's stride
    x = F.gelu(self.conv1(F.pad(mel, (2, 0))))
    x = F.gelu(self.conv2(F.pad(x, (2, 0)))).transpose(1, 2)
    frames = x.shape[1]
    x = x + self.positions[:frames]
    blocks = torch.arange(frames) // self.block
    visible = (blocks[None, :] <= blocks[:, None]) & valid[None, :]
    mask = torch.where(visible, 0.0, torch.finfo(torch.float32).min)[None, None]
    for layer in self.stack:
      x = layer(x, mask)
      x = x[0] if isinstance(x, tuple) else x
    pooled = F.avg_pool1d(F.pad(x.transpose(1, 2), (0, -frames % self.pool)), self.pool).transpose(1, 2)
    return _nearest(pooled[0], self.codebook).numpy()


class BaichuanReference(Reference):
  """Baichuan-Audio's tokenizer at the release's shapes: 32 layers of 1280, 20 heads, FFN 5120, the bridge to 5120,
  RVQ of 8192, 4096, 2048 and five 1024 codes."""

  kind = "baichuan_audio"
  d, heads, ffn, layers, pool = 1280, 20, 5120, 32, 4
  sizes = (8192, 4096, 2048, 1024, 1024, 1024, 1024, 1024)

  def __init__(self):
    import torch

    torch.manual_seed(0)
    wide = self.d * self.pool
    self.conv1 = torch.nn.Conv1d(128, self.d, 3, padding=1)
    self.conv2 = torch.nn.Conv1d(self.d, self.d, 3, stride=2, padding=1)
    self.stack = _whisper_layers(self.d, self.heads, self.ffn, self.layers)
    self.norm = torch.nn.LayerNorm(self.d)
    self.positions = _sinusoids(1500, self.d)
    self.gate = torch.nn.Conv1d(self.d, wide, self.pool, stride=self.pool, bias=False)
    self.up = torch.nn.Conv1d(self.d, wide, self.pool, stride=self.pool, bias=False)
    self.down = torch.nn.Linear(wide, wide, bias=False)
    self.bridge_norm = torch.nn.LayerNorm(wide)
    self.codebooks = [torch.randn(n, wide) for n in self.sizes]

  def save(self, folder: str) -> None:
    model, bridge = "audio_tokenizer.audio_model.", "audio_tokenizer.audio_bridge_model."
    tensors = {f"{model}conv1.weight": self.conv1.weight, f"{model}conv1.bias": self.conv1.bias,
               f"{model}conv2.weight": self.conv2.weight, f"{model}conv2.bias": self.conv2.bias,
               f"{model}layer_norm.weight": self.norm.weight, f"{model}layer_norm.bias": self.norm.bias,
               f"{model}positional_embedding": self.positions, f"{bridge}gate_proj.weight": self.gate.weight,
               f"{bridge}up_proj.weight": self.up.weight, f"{bridge}down_proj.weight": self.down.weight,
               f"{bridge}layer_norm.weight": self.bridge_norm.weight, f"{bridge}layer_norm.bias": self.bridge_norm.bias}
    tensors.update({f"{bridge}vq_list.{i}.codebook.embed": c for i, c in enumerate(self.codebooks)})
    for i, layer in enumerate(self.stack):
      tensors.update({f"{model}layers.{i}.{k}": v for k, v in layer.state_dict().items()})
    _save(tensors, os.path.join(folder, "model.safetensors"))
    audio_config = {"enable": True, "d_model": self.d, "encoder_layers": self.layers,
                    "encoder_attention_heads": self.heads, "encoder_ffn_dim": self.ffn, "num_mel_bins": 128,
                    "n_fft": 400, "hop_length": 160, "sampling_rate": 16000, "max_audio_seconds": 30,
                    "kernel_size": 3, "stride_size": 2, "avg_pooler": self.pool, "split_overlap": 0.0,
                    "activation_function": "gelu", "vq_config": {"enable": True, "codebook_sizes": list(self.sizes)}}
    with open(os.path.join(folder, "config.json"), "w") as f:
      json.dump({"model_type": "omni", "audio_config": audio_config}, f)

  def __call__(self, features: np.ndarray) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    mel = torch.from_numpy(np.ascontiguousarray(features.T))[None]
    x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
    x = x + self.positions[: x.shape[1]]
    for layer in self.stack:
      x = layer(x, None)
      x = x[0] if isinstance(x, tuple) else x
    x = self.norm(x).transpose(1, 2)
    x = F.pad(x, (0, -x.shape[2] % self.pool))
    grouped = x.transpose(1, 2).reshape(1, -1, self.d * self.pool)
    c = self.down((F.silu(self.gate(x)) * self.up(x)).transpose(1, 2))
    encoder_frames = (mel.shape[2] - 1) // 2 + 1
    residual = self.bridge_norm(c + grouped)[0, : encoder_frames // self.pool]  # trailing frames are dropped
    codes = []
    for codebook in self.codebooks:
      index = _nearest(residual, codebook)
      codes.append(index)
      residual = residual - codebook[index]
    return torch.stack(codes, -1).numpy()


class MimiReference(Reference):
  """transformers' MimiModel at its default (the release's) config, random weights; its first 8 codebooks."""

  kind, codebooks = "mimi", 8

  def __init__(self):
    import torch
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(0)
    self.model = MimiModel(MimiConfig()).eval()

  def save(self, folder: str) -> None:
    self.model.save_pretrained(folder)

  @classmethod
  def jax_tokenizer(cls, folder: str):
    from tasks.audio.mimi import MimiTokenizer  # jax loads with it: only when this tokenizer is benchmarked

    return MimiTokenizer(folder, cls.codebooks)

  def __call__(self, features: np.ndarray) -> np.ndarray:
    import torch

    wave = torch.from_numpy(np.ascontiguousarray(features[:, 0]))[None, None]
    return self.model.encode(wave, num_quantizers=self.codebooks).audio_codes[0].T.numpy()


class HubertReference(Reference):
  """transformers' HubertModel at its default (HuBERT base) config, random weights, layer 11 (twist.yaml's) to the
  nearest of 500 centroids."""

  kind, layer, units = "hubert_kmeans", 11, 500

  def __init__(self):
    import torch
    from transformers import HubertConfig, HubertModel

    torch.manual_seed(0)
    self.model = HubertModel(HubertConfig()).eval()
    self.centroids = torch.randn(self.units, self.model.config.hidden_size)

  def save(self, folder: str) -> None:
    self.model.save_pretrained(folder)
    np.save(os.path.join(folder, "km500.npy"), self.centroids.numpy())

  @classmethod
  def jax_tokenizer(cls, folder: str):
    from tasks.audio.hubert import HubertKmeansTokenizer  # jax loads with it: only when this tokenizer is benchmarked

    return HubertKmeansTokenizer(folder, os.path.join(folder, "km500.npy"), cls.layer, deduplicate=False)

  def __call__(self, features: np.ndarray) -> np.ndarray:
    import torch

    wave = torch.from_numpy(np.ascontiguousarray(features[:, 0]))[None]
    hidden = self.model(wave, output_hidden_states=True).hidden_states[self.layer][0]
    return _nearest(hidden, self.centroids).numpy()


class KimiWhisperReference(Reference):
  """Kimi-Audio's continuous features (`tasks.audio.kimi_whisper`): transformers' `WhisperEncoder` at `shape`
  (whisper-large-v3's by default: 32 layers of 1280, 20 heads, FFN 5120, 128 mels, 1,500 positions) over each 30 s
  window's bf16-rounded, zero-padded mel, one window a call as upstream runs them (whisper.py:184-221); a wave's
  first 4T rows of each window as [T, 5120]. Every window costs all 1,500 frames whatever the utterance's length,
  so its FLOPs are counted per window; the features are compared by their largest difference, not as codes."""

  kind, folder_name = "kimi_whisper", "whisper-large-v3"
  release_shape = kimi_whisper.EncoderShape(d_model=1280, heads=20, ffn=5120, layers=32, positions=1500)

  def __init__(self, shape: kimi_whisper.EncoderShape = release_shape):
    import torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    self.config = WhisperConfig(d_model=shape.d_model, encoder_attention_heads=shape.heads,
                                encoder_ffn_dim=shape.ffn, encoder_layers=shape.layers,
                                max_source_positions=shape.positions, num_mel_bins=kimi_whisper.N_MELS,
                                attn_implementation="sdpa")
    self.encoder = WhisperEncoder(self.config).eval()

  def save(self, folder: str) -> None:
    """The release's `whisper-large-v3/`: config.json and the encoder's tensors under `encoder.`, as a saved
    WhisperModel names them (its decoder is never run, so it is not written)."""
    path = os.path.join(folder, self.folder_name)
    os.makedirs(path)
    self.config.to_json_file(os.path.join(path, "config.json"))
    _save({kimi_whisper.ENCODER_PREFIX + k: v for k, v in self.encoder.state_dict().items()},
          os.path.join(path, "model.safetensors"))

  @classmethod
  def jax_tokenizer(cls, folder: str) -> kimi_whisper.KimiWhisperFeatures:
    return kimi_whisper.KimiWhisperFeatures(os.path.join(folder, cls.folder_name))

  @staticmethod
  def encode(tokenizer, waves: list[np.ndarray]) -> list[np.ndarray]:
    return tokenizer.features(waves)

  @staticmethod
  def host_features(tokenizer, wave: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """(the bf16-rounded mel [3000, 128] the JAX side encodes, T) per 30 s piece of the wave."""
    return [(kimi_whisper.window_mel(piece), kimi_whisper.code_frames(len(piece)))
            for piece in kimi_whisper.pieces(wave)]

  def flops(self, tokenizer, waves: list[np.ndarray]) -> float:
    """FLOPs of one window (any piece: all 1,500 frames run) times the waves' windows."""
    window = counted_flops(lambda: self(self.host_features(tokenizer, np.zeros(1, np.float32))))
    return window * sum(len(kimi_whisper.pieces(w)) for w in waves)

  @staticmethod
  def jax_extras(tokenizer, waves: list[np.ndarray]) -> dict:
    """The batching: the windows, the default batch size (kimi_whisper.default_batch_size), and the same waves at
    the other of 1 and BATCHED windows a step (warmed up on the first wave: its shape compiles anew)."""
    windows, default = sum(len(kimi_whisper.pieces(w)) for w in waves), tokenizer.batch_size
    tokenizer.batch_size = BATCHED if default == 1 else 1
    warm, _, _ = timed(lambda: tokenizer.features(waves[:1]))
    wall, cpu, _ = timed(lambda: tokenizer.features(waves))
    other = {"batch_size": tokenizer.batch_size, "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
             "warmup_seconds": round(warm, 2)}
    tokenizer.batch_size = default
    return {"windows": windows, "batch_size": default, "other_batch": other}

  def __call__(self, windows: list[tuple[np.ndarray, int]]) -> np.ndarray:
    import torch

    rows = []
    for mel, frames in windows:
      hidden = self.encoder(torch.from_numpy(np.ascontiguousarray(mel.T))[None]).last_hidden_state[0]
      rows.append(hidden[: kimi_whisper.FRAMES_PER_CODE * frames].reshape(frames, -1).numpy())
    return np.concatenate(rows)

  @staticmethod
  def compare(ours: list[np.ndarray], theirs: list[np.ndarray]) -> dict:
    """The largest difference of any feature, absolute and over the torch features' largest magnitude."""
    for index, (a, b) in enumerate(zip(ours, theirs)):
      if a.shape != b.shape:
        raise ValueError(f"utterance {index}: JAX features {a.shape}, torch features {b.shape}")
    difference = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    scale = max(float(np.abs(b).max()) for b in theirs)
    return {"features_max_abs_difference": difference, "features_relative_difference": difference / scale}

  @staticmethod
  def agreement(result: dict) -> str:
    return (f"features: max abs diff {result['features_max_abs_difference']:.1e} "
            f"(relative {result['features_relative_difference']:.1e})")

  @staticmethod
  def notes(result: dict) -> tuple[dict, list[str]]:
    """What one utterance costs: a whole window's FLOPs and seconds on each side, and what batching windows across
    utterances gains on the JAX side (a last partial batch runs only the windows left)."""
    jax_side, utterances = result["jax"], result["utterances"]
    windows, other = jax_side["windows"], jax_side["other_batch"]
    by_batch = {jax_side["batch_size"]: (jax_side["seconds"], jax_side["cpu_seconds"]),
                other["batch_size"]: (other["seconds"], other["cpu_seconds"])}
    figures = {
        "gflop_per_window": round(result["gflop_per_audio_second"] * result["audio_seconds"] / windows, 1),
        "mean_utterance_seconds": round(result["audio_seconds"] / utterances, 2),
        "seconds_per_utterance": {"torch": round(result["torch"]["seconds"] / utterances, 2),
                                  **{f"jax_batch_{b}": round(s / utterances, 2) for b, (s, _) in by_batch.items()}},
        "cpu_seconds_per_window": {"torch": round(result["torch"]["cpu_seconds"] / windows, 2),
                                   **{f"jax_batch_{b}": round(c / windows, 2) for b, (_, c) in by_batch.items()}},
        "windows": windows, "batching_gain": round(by_batch[1][0] / by_batch[BATCHED][0], 2)}
    per_utterance, per_window = figures["seconds_per_utterance"], figures["cpu_seconds_per_window"]
    lines = [
        f"{result['tokenizer']}: one 30 s window is {figures['gflop_per_window']} GFLOP whatever the utterance's "
        f"length; these {utterances} utterances average {figures['mean_utterance_seconds']} s, so "
        f"{result['gflop_per_audio_second']} GFLOP per audio second. Seconds per utterance: torch "
        f"{per_utterance['torch']} (one window a call), JAX {per_utterance['jax_batch_1']} (one window a step), "
        f"JAX {per_utterance[f'jax_batch_{BATCHED}']} (batches of {BATCHED}).",
        f"{result['tokenizer']}: batching {BATCHED} windows across utterances: {figures['batching_gain']}x the speed "
        f"of one at a time; CPU seconds per window: torch {per_window['torch']}, JAX one a step "
        f"{per_window['jax_batch_1']}, JAX batched {per_window[f'jax_batch_{BATCHED}']}."]
    return {"per_utterance": figures}, lines


# ---- the run: one process per side ------------------------------------------------------------------------------

REFERENCES = {r.kind: r for r in (Glm4VoiceReference, BaichuanReference, MimiReference, HubertReference,
                                   KimiWhisperReference)}


def run_side(side: str, kind: str, folder: str, audio_seconds: float) -> dict:
  """One side of one tokenizer in this process: its matmul rate, a warm-up and a timed run over the recordings, the
  outputs (codes or features, saved in `folder` for the parent to compare) and the peak RSS while tokenizing
  (weights included). The torch side also counts the reference's FLOPs over the recordings; it computes its host
  features with the JAX tokenizer's code, whose weights it drops first."""
  reference_type = REFERENCES[kind]
  tokenizer = reference_type.jax_tokenizer(folder)
  waves = recordings(tokenizer.sample_rate, audio_seconds)
  out = {"utterances": len(waves), "audio_seconds": sum(len(w) for w in waves) / tokenizer.sample_rate,
         "matmul_gflop_per_second": round(matmul_rate(side) / 1e9, 1)}
  if side == "jax":
    with PeakRss() as peak:
      warm, _, _ = timed(lambda: reference_type.encode(tokenizer, waves))
      wall, cpu, outputs = timed(lambda: reference_type.encode(tokenizer, waves))
    out.update(reference_type.jax_extras(tokenizer, waves))
  else:
    import torch

    del tokenizer.params
    reference = reference_type()

    def forward(some):  # from the same host features the JAX side computes
      with torch.inference_mode():
        return [reference(reference.host_features(tokenizer, w)) for w in some]

    with PeakRss() as peak:
      warm, _, _ = timed(lambda: forward(waves[:1]))
      wall, cpu, outputs = timed(lambda: forward(waves))
    out["flops"] = reference.flops(tokenizer, waves)
  np.savez(os.path.join(folder, f"outputs_{side}.npz"), *outputs)
  out.update({"seconds": round(wall, 2), "cpu_seconds": round(cpu, 2), "warmup_seconds": round(warm, 2),
              "peak_rss_gb": round(peak.bytes / 2**30, 2)})
  return out


def _in_subprocess(side: str, kind: str, folder: str, audio_seconds: float) -> dict:
  command = [sys.executable, "-m", "s2sjax.benchmarks.audio_tokenizers", f"--side={side}", f"--tokenizers={kind}",
             f"--folder={folder}", f"--audio_seconds={audio_seconds}"]
  subprocess.run(command, check=True)
  if side == "write":
    return {}
  with open(os.path.join(folder, f"{side}.json")) as f:
    return json.load(f)


def bench_one(kind: str, audio_seconds: float) -> dict:
  with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as folder:
    _in_subprocess("write", kind, folder, audio_seconds)
    sides = {side: _in_subprocess(side, kind, folder, audio_seconds) for side in SIDES}
    ours, theirs = (list(np.load(os.path.join(folder, f"outputs_{side}.npz")).values()) for side in ("jax", "torch"))
  seconds, utterances = sides["jax"]["audio_seconds"], sides["jax"]["utterances"]
  flops = sides["torch"].pop("flops") / seconds
  for side in sides.values():
    del side["audio_seconds"], side["utterances"]
    side["audio_seconds_per_second"] = round(seconds / side["seconds"], 2)
    side["gflop_per_second"] = round(flops * seconds / side["seconds"] / 1e9, 1)
    side["percent_of_matmul"] = round(100 * side["gflop_per_second"] / side["matmul_gflop_per_second"], 1)
  return {"tokenizer": kind, "utterances": utterances, "audio_seconds": round(seconds, 2),
          "gflop_per_audio_second": round(flops / 1e9, 2), **sides,
          "speedup": round(sides["torch"]["seconds"] / sides["jax"]["seconds"], 2),
          **REFERENCES[kind].compare(ours, theirs)}


def machine() -> dict:
  import torch

  return {"processor": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
          "torch_threads": torch.get_num_threads()}


COLUMNS = ("| tokenizer | audio s | GFLOP / audio s | torch audio s/s | JAX audio s/s | JAX / torch | torch GFLOP/s "
           "(% of its matmul) | JAX GFLOP/s (% of its matmul) | torch peak GB | JAX peak GB | codes equal, or features' "
           "largest difference |")


def row(r: dict) -> str:
  torch_side, jax_side = r["torch"], r["jax"]
  return (f"| {r['tokenizer']} | {r['audio_seconds']} | {r['gflop_per_audio_second']} | "
          f"{torch_side['audio_seconds_per_second']} | {jax_side['audio_seconds_per_second']} | {r['speedup']}x | "
          f"{torch_side['gflop_per_second']} ({torch_side['percent_of_matmul']}%) | "
          f"{jax_side['gflop_per_second']} ({jax_side['percent_of_matmul']}%) | {torch_side['peak_rss_gb']} | "
          f"{jax_side['peak_rss_gb']} | {REFERENCES[r['tokenizer']].agreement(r)} |")


def main(argv):
  del argv
  if FLAGS.side:  # one side of one tokenizer, started by the run below
    (kind,) = FLAGS.tokenizers
    if FLAGS.side == "write":
      REFERENCES[kind]().save(FLAGS.folder)
      return
    result = run_side(FLAGS.side, kind, FLAGS.folder, FLAGS.audio_seconds)
    with open(os.path.join(FLAGS.folder, f"{FLAGS.side}.json"), "w") as f:
      json.dump(result, f)
    return
  results, notes = [], []
  print(COLUMNS)
  print("|" + "---|" * COLUMNS.count(" | ") + "---|")
  for kind in FLAGS.tokenizers:
    results.append(bench_one(kind, FLAGS.audio_seconds))
    print(row(results[-1]), flush=True)
    figures, lines = REFERENCES[kind].notes(results[-1])
    results[-1].update(figures)
    notes += lines
  for line in notes:
    print(line)
  found = machine()
  matmul = "; ".join(f"{r['tokenizer']}: torch {r['torch']['matmul_gflop_per_second']}, XLA "
                     f"{r['jax']['matmul_gflop_per_second']}" for r in results)
  print(f"machine: {found['processor']}, {found['cores']} cores, torch {found['torch_threads']} threads; fp32 "
        f"{MATMUL_SIZE}^2 matmul GFLOP/s in each side's process: {matmul}")
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump({"machine": found, "results": results}, f, indent=2, allow_nan=False)


FLAGS = flags.FLAGS

if __name__ == "__main__":
  flags.DEFINE_list("tokenizers", list(REFERENCES), "Tokenizers to measure: " + ", ".join(REFERENCES) + ".")
  flags.DEFINE_float("audio_seconds", 60.0, "Seconds of the sample's speech each side tokenizes.")
  flags.DEFINE_string("output", None, "Write the figures as JSON here.")
  flags.DEFINE_enum("side", None, ("write",) + SIDES, "Internal: run one side of one tokenizer in this process.")
  flags.DEFINE_string("folder", None, "Internal: the release folder a side reads and writes its results to.")
  cli.run(main)
