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
