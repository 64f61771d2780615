"""What the training-stack tests share: the MaxText oracle (../shared/upstream-oracles/maxtext: checkpoints MaxText's
own code wrote, and its forward's log-probs), and the bundled sample built for its 256-id vocabulary (a byte-level
tokenizer, audio units laid on the same 256 ids)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ORACLES = Path(__file__).resolve().parents[1].parent / "shared" / "upstream-oracles"
MAXTEXT = ORACLES / "maxtext"
needs_maxtext_oracle = pytest.mark.skipif(not MAXTEXT.is_dir(), reason="the MaxText oracle "
                                          "(../shared/upstream-oracles/maxtext) is not beside this checkout")
CONFIGS = ("qwen2.5_scan", "qwen2.5_noscan", "llama3.1_scan", "llama3.1_noscan")
KINDS = {"training state": "run/checkpoints/1", "params only": "params_only"}
LENGTHS = (40, 25)  # the valid tokens of the oracle's two padded sequences (meta.json "inputs")
# The bundled sample for a 256-id model: text as bytes, mel k-means unit k as id k (ids the tokenizer has).
BYTES_SPEC = """name: maxtext_bytes
audio_mode: extended_vocab
audio_tokenizer: {type: mel_kmeans, codebook: bundled, dedup: true}
codebook_sizes: [256]
unit_offset: 0
"""


def run_config(config: str) -> str:
  """The run config a MaxText user passed: the oracle's train.py command line (worker_report.json argv_train)."""
  return " ".join(json.loads((MAXTEXT / config / "worker_report.json").read_text())["argv_train"])


def folder(config: str, kind: str) -> str:
  return str(MAXTEXT / config / KINDS[kind])


def byte_tokenizer(directory: str) -> str:
  """A transformers tokenizer of the 256 byte-level symbols, no merges: every text in 256 ids."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
  tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)
  return directory


def build_bytes_sample(root: str) -> dict[str, str]:
  """{tokenizer, spec, data_dir}: the bundled sample's sstorycloze built for a 256-id model, all four modalities
  (the session's `bytes_sample` fixture, tests/conftest.py)."""
  from tasks.preparation import prepare

  tokenizer = byte_tokenizer(os.path.join(root, "bytes_tokenizer"))
  spec = os.path.join(root, "maxtext_bytes.yaml")
  Path(spec).write_text(BYTES_SPEC)
  data_dir = os.path.join(root, "data")
  for modality in ("t2t", "s2t", "t2s", "s2s"):
    prepare("sstorycloze", spec, modality, None, data_dir, tokenizer_dir=tokenizer)
  return {"tokenizer": tokenizer, "spec": spec, "data_dir": data_dir}


# A tiny Qwen2.5-shaped MaxText run, scanned layers, float32: small enough to write in a test and to damage one
# array at a time.
TINY_RUN = ("model_name=qwen2.5-7b base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 "
            "base_mlp_dim=96 base_num_decoder_layers=2 vocab_size=256 scan_layers=true max_target_length=64")


def tiny_maxtext_checkpoint(path: str, run: str = TINY_RUN, ocdbt: bool = False, seed: int = 0) -> str:
  """A MaxText checkpoint folder as `save_params_to_path` writes one (checkpointing.py:1112: {"params": params} as
  the `items` checkpointable, by orbax), of random float32 parameters of the shapes `run` implies; `ocdbt=False`
  stores each array in its own zarr3 folder (MaxText's checkpoint_storage_use_ocdbt=False)."""
  import numpy as np
  from orbax.checkpoint.experimental import v1 as ocp

  from s2sjax.scoring.checkpoints.stacks import maxtext, maxtext_config

  tree: dict = {}
  rng = np.random.default_rng(seed)
  for name, shape in maxtext.expected_shapes(maxtext_config.describe(maxtext_config.RunConfig.parse(run))).items():
    maxtext._put(tree, name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
  context = ocp.Context()
  context.array.saving.use_ocdbt = ocdbt
  with context:
    ocp.save_checkpointables(path, {"items": {"params": {"params": tree}}})
  return path
