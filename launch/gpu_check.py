r"""The whole benchmark on one accelerator, timed in one run: each audio tokenizer over recordings of the replica's
lengths, the Qwen2.5-7B-shaped scoring step, and from them the minutes the whole replica takes. `launch/gpu_check.sh`
runs it (on a bare GPU host: the wheels it needs carried beside it); `--smoke` runs tiny shapes on a CPU in seconds.

  python -m launch.gpu_check [--smoke] [--recordings=240] [--output=gpu_check.json]

One table, a line per figure, each saying whether it was measured or extrapolated:

- a tokenizer line per tokenizer (GLM-4-Voice, Baichuan-Audio, Mimi, HuBERT; random weights at the releases' shapes,
  `s2sjax.benchmarks.audio_tokenizers`'s; tiny ones with --smoke), each in a process of its own: `--recordings` noise recordings whose
  lengths are drawn from the replica's manifest (`tasks/audio/replica_lengths.json`; a tokenizer's cost depends on
  the length alone) tokenized under the accelerator's shape policy (fixed windows): programs and compile seconds,
  audio s/s past compiling, the device's peak memory, and the minutes the replica's 78.8 hours take at that rate
  (extrapolated) plus the compiling;
- the scoring step, Qwen2.5-7B-shaped, 8 rows of 2,048, bf16 (`s2sjax.benchmarks.accelerator.measure`): tokens/s
  and MFU (measured);
- each task x modality of the replica scored by that step: its tokens (text at TOKENS_PER_CHARACTER of the
  replica's characters, speech at SPEECH_TOKENS_PER_SECOND of its seconds) over the measured tokens/s
  (extrapolated);
- the whole benchmark: every tokenizer's replica minutes (each tokenizer is one model's: a run uses one) are
  listed, and the total takes the slowest tokenizer plus all scoring (extrapolated).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from s2sjax.runtime import cli
from tasks.audio import replica_lengths

TOKENIZERS = ("glm4_voice", "baichuan_audio", "mimi", "hubert_kmeans")
# What the replica's texts come to in a Qwen2.5-style vocabulary: about 4 characters a token for English, 1.4 for
# Chinese (assumed, not measured here), and speech at GLM-4-Voice's 12.5 codes a second.
TOKENS_PER_CHARACTER = {"en": 0.25, "cmn": 0.7}
SPEECH_TOKENS_PER_SECOND = 12.5
MODALITIES = {"t2t": ("text", "text"), "s2t": ("speech", "text"), "t2s": ("text", "speech"),
              "s2s": ("speech", "speech")}
LANGUAGE = {"sstorycloze": "en", "zh_sstorycloze": "cmn", "scmmlu": "cmn"}
SMOKE_SHORTER = 10  # --smoke's recordings: the replica's lengths over this
STEP = {"full": ("qwen2.5-7b", 2048, 8, "bfloat16"), "smoke": ("tiny", 256, 2, "float32")}


def smoke_release(kind: str, folder: str) -> None:
  """A tiny random release folder of `kind` in its real layout (the `s2sjax.benchmarks.audio_tokenizers` references, shrunk)."""
  from s2sjax.benchmarks import audio_tokenizers as bench

  reference = bench.REFERENCES[kind]
  if kind in ("glm4_voice", "baichuan_audio"):
    tiny = type("Tiny", (reference,), dict(d=64, heads=4, ffn=128, layers=2, codes=64, sizes=(64, 32)))
    tiny().save(folder)
    return
  import torch

  torch.manual_seed(0)
  if kind == "mimi":
    from transformers import MimiConfig, MimiModel

    MimiModel(MimiConfig(hidden_size=32, num_filters=4, num_hidden_layers=2, intermediate_size=64,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=8, codebook_size=64, codebook_dim=16,
                         vector_quantization_hidden_dimension=16, num_quantizers=10, sliding_window=8,
                         upsample_groups=32)).save_pretrained(folder)
    return
  from transformers import HubertConfig, HubertModel

  model = HubertModel(HubertConfig(hidden_size=32, num_hidden_layers=reference.layer, num_attention_heads=4,
                                   intermediate_size=64, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                   conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2)))
  model.save_pretrained(folder)
  np.save(os.path.join(folder, "km500.npy"), np.random.default_rng(0).normal(size=(reference.units, 32)).astype(
      np.float32))


def tokenizer_part(kind: str, recordings: int, smoke: bool, folder: str) -> dict:
  """One tokenizer in this process: its release folder written, `recordings` of the replica's lengths tokenized
  under fixed windows; the figures."""
  import jax

  from s2sjax.benchmarks import audio_tokenizers as bench

  if smoke:
    smoke_release(kind, folder)
  else:
    bench.REFERENCES[kind]().save(folder)
  tokenizer = bench.REFERENCES[kind].jax_tokenizer(folder).configure(shapes="windows")
  seconds = replica_lengths.sample(recordings, seed=0) / (SMOKE_SHORTER if smoke else 1)
  waves = replica_lengths.synthetic_waves(seconds, tokenizer.sample_rate)
  start = time.time()
  tokenizer.encode_batch(waves)
  wall = time.time() - start
  report = tokenizer.run_report()
  stats = jax.local_devices()[0].memory_stats() or {}
  computing = max(wall - report["compile_seconds"], 1e-9)
  return {"tokenizer": kind, "recordings": recordings, "audio_seconds": round(float(seconds.sum()), 1),
          "programs": report["programs"], "compile_seconds": report["compile_seconds"],
          "audio_seconds_per_second": round(float(seconds.sum()) / computing, 1),
          "peak_device_gib": round(stats["peak_bytes_in_use"] / 2**30, 2) if "peak_bytes_in_use" in stats else None,
          "device": jax.devices()[0].device_kind}


def step_part(smoke: bool) -> dict:
  """The scoring step at its shape: tokens/s and MFU."""
  import jax.numpy as jnp

  from s2sjax.benchmarks.accelerator import measure

  size, length, rows, dtype = STEP["smoke" if smoke else "full"]
  result = measure(size, length, rows, "xla", jnp.dtype(dtype), protocol="noshare")
  result.pop("candidate_nll", None)
  return result


def replica_tokens(manifest: dict) -> dict[tuple[str, str], float]:
  """(task, modality) -> the tokens its rows hold over the replica (tStoryCloze: sStoryCloze's recordings)."""
  seconds = {key: sum(s * n for s, n in rows) for key, rows in manifest["bins"].items()}
  per_character = manifest["seconds_per_character"]
  tokens = {}
  for task, language in LANGUAGE.items():
    for modality, sides in MODALITIES.items():
      total = 0.0
      for role, side in zip(("prefixes", "candidates"), sides):
        spoken = seconds[f"{task}/{role}"]
        total += spoken * SPEECH_TOKENS_PER_SECOND if side == "speech" else \
            spoken / per_character[language] * TOKENS_PER_CHARACTER[language]
      tokens[(task, modality)] = total
      if task == "sstorycloze":
        tokens[("tstorycloze", modality)] = total
  return tokens


def table(tokenizers: list[dict], step: dict, manifest: dict) -> tuple[list[str], dict]:
  """The printed lines and the figures behind them."""
  hours = manifest["audio_hours"]
  lines = ["| what | how | figures | replica minutes |", "|---|---|---|---|"]
  minutes = {}
  for r in tokenizers:
    replica = hours * 3600 / r["audio_seconds_per_second"] / 60 + r["compile_seconds"] / 60
    minutes[r["tokenizer"]] = replica
    peak = f"{r['peak_device_gib']} GiB" if r["peak_device_gib"] is not None else "n/a (no device statistics)"
    lines.append(f"| tokenizer {r['tokenizer']} | measured: {r['recordings']} recordings, {r['audio_seconds']:,.0f} "
                 f"audio s; extrapolated to {hours} h | compile {r['compile_seconds']:.1f} s ({r['programs']} "
                 f"programs), {r['audio_seconds_per_second']:,.0f} audio s/s, peak {peak} | {replica:.1f} |")
  if "skipped" in step:
    lines.append(f"| scoring step {step['size']} | not measured | {step['skipped']} | |")
    return lines, {"tokenizer_minutes": minutes}
  mfu = f"{step['mfu']:.1%}" if step.get("mfu") is not None else "n/a (no peak known)"
  lines.append(f"| scoring step {step['size']}, {step['rows']} x {step['row_length']}, {step['dtype']} | measured | "
               f"{step['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, compile {step['compile_s']:.1f} s | |")
  scoring = {}
  for (task, modality), tokens in sorted(replica_tokens(manifest).items()):
    scoring[f"{task}/{modality}"] = tokens / step["tokens_per_s"] / 60
    lines.append(f"| scoring {task} {modality} | extrapolated at the measured tokens/s | {tokens / 1e6:,.2f} M "
                 f"tokens | {scoring[f'{task}/{modality}']:.1f} |")
  whole = max(minutes.values(), default=0.0) + sum(scoring.values())
  lines.append(f"| whole benchmark | extrapolated: the slowest tokenizer + every task x modality scored | "
               f"{sum(replica_tokens(manifest).values()) / 1e6:,.1f} M tokens scored | {whole:.1f} |")
  return lines, {"tokenizer_minutes": minutes, "scoring_minutes": scoring, "whole_minutes": whole}


def main(argv):
  del argv
  if FLAGS.part:  # one tokenizer, in its own process (its own peak memory, its memory freed after)
    print(json.dumps(tokenizer_part(FLAGS.part, FLAGS.recordings, FLAGS.smoke, FLAGS.folder)))
    return
  tokenizers = []
  for kind in FLAGS.tokenizers:
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{kind}-") as folder:
      done = subprocess.run([sys.executable, "-m", "launch.gpu_check", f"--part={kind}", f"--folder={folder}",
                             f"--recordings={FLAGS.recordings}", f"--smoke={FLAGS.smoke}"],
                            capture_output=True, text=True)
      if done.returncode:
        print(f"| tokenizer {kind} | failed | {(done.stderr.strip().splitlines() or [''])[-1][:200]} | |")
        continue
      tokenizers.append(json.loads(done.stdout.strip().splitlines()[-1]))
  step = step_part(FLAGS.smoke)
  lines, figures = table(tokenizers, step, replica_lengths.load())
  print("\n".join(lines))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump({"tokenizers": tokenizers, "step": step, **figures}, f, indent=2)


FLAGS = flags.FLAGS

if __name__ == "__main__":
  flags.DEFINE_bool("smoke", False, "Tiny shapes, a few short recordings: the check's own test, on a CPU.")
  flags.DEFINE_integer("recordings", 240, "Recordings of the replica's lengths each tokenizer tokenizes.")
  flags.DEFINE_list("tokenizers", list(TOKENIZERS), "Tokenizers to time.")
  flags.DEFINE_string("output", None, "Write the figures as JSON here.")
  flags.DEFINE_string("part", None, "Internal: time this one tokenizer in this process.")
  flags.DEFINE_string("folder", None, "Internal: where that tokenizer's release folder is written.")
  cli.run(main)
