"""Built task data as the evaluator reads it: the packed rows, the question table and the build's metadata.

`tasks.prepare` writes one TFDS config per task x spec x modality x row length x variant (`demo-s2t-1024`,
`-noshare`, ...) under `<data_dir>/<task>/<config>/<version>`; the names are made here, by `config_name`, so the
build and the reader cannot disagree. Reading needs no TensorFlow (array_record through TFDS's data source).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re

import numpy as np
from etils import epath

from s2sjax import benchmarks, modalities
from s2sjax.packing import RowShape
from s2sjax.questions import QuestionTable
from s2sjax.spec import is_spec_path, load_spec

# 1.1.0: Moshi S->S targets carry the paper's stream weights (100 semantic, 1 acoustic), not semantic-only ones
DATA_VERSION = "1.1.0"


class DataError(ValueError):
  """Built data that is missing or does not fit; the message says what to run."""


PROTOCOLS = ("s2sbench", "utterance")
OVERLONG = ("error", "truncate_prefix")
TOKENIZATIONS = ("separate", "joint")


@dataclasses.dataclass(frozen=True)
class Variants:
  """The build options that change the rows, and so name another built config."""

  share_prefix: bool = True
  reference_language_quirk: bool = False  # S2SBench's code applies the last dataset's language (zh) to all
  overlong: str = "error"  # or "truncate_prefix": drop prefix tokens of items longer than the row (counted)
  # "s2sbench": prefix + candidate, the candidate's tokens scored; "utterance" (S->S only): TWIST / SlamKit's
  # whole spoken story, every unit after bos scored (tasks/build.py)
  protocol: str = "s2sbench"
  # T->T: "separate" tokenizes prefix and candidate apart (the scored tokens are exactly the candidate's);
  # "joint" is S2SBench's reference rule: first + last as one string, the tokens past the prefix's count scored
  tokenization: str = "separate"

  def __post_init__(self):
    if self.overlong not in OVERLONG:
      raise ValueError(f"overlong must be one of {OVERLONG}, not {self.overlong!r}")
    if self.protocol not in PROTOCOLS:
      raise ValueError(f"protocol must be one of {PROTOCOLS}, not {self.protocol!r}")
    if self.tokenization not in TOKENIZATIONS:
      raise ValueError(f"tokenization must be one of {TOKENIZATIONS}, not {self.tokenization!r}")


def spec_label(spec: str) -> str:
  """A preset's name; for a YAML path, the spec's own name and a hash of its resolved contents (a path would put
  slashes in the config name, and two files may carry one name)."""
  if not is_spec_path(spec):
    return spec
  loaded = load_spec(spec)
  return f"{re.sub(r'[^A-Za-z0-9_.]+', '_', loaded.name)}-{loaded.digest()[:8]}"


def config_name(spec: str, modality: str, row_length: int | None, variants: Variants = Variants()) -> str:
  """`demo-s2t-1024` (`mine-1a2b3c4d-s2t-1024` for a YAML spec; `demo-s2t-auto` for rows whose length the build
  chose from its items, s2sjax.packing.auto_row_length); variants that change the rows say so:
  `-noshare`, `-zhquirk`, `-truncate`, `-utterance`, `-joint`."""
  return (f"{spec_label(spec)}-{modalities.get(modality).name}-{row_length or 'auto'}"
          + ("" if variants.share_prefix else "-noshare")
          + ("-zhquirk" if variants.reference_language_quirk else "")
          + ("-truncate" if variants.overlong == "truncate_prefix" else "")
          + ("-utterance" if variants.protocol == "utterance" else "")
          + ("-joint" if variants.tokenization == "joint" else ""))


def tokenizer_identity(tokenizer) -> dict:
  """What tells two text tokenizers apart: a hash of the vocabulary in id order (plus its size and class)."""
  vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
  digest = hashlib.sha256("\n".join(token for token, _ in vocab).encode()).hexdigest()[:16]
  return {"class": type(tokenizer).__name__, "name_or_path": os.path.basename(str(tokenizer.name_or_path)),
          "size": len(tokenizer), "vocab_sha": digest}


def load_rows(data_dir: str, task: str, config: str) -> tuple[dict[str, np.ndarray], dict]:
  """All packed rows of a built task/config, in row order, and its metadata."""
  import tensorflow_datasets as tfds

  path = os.path.join(str(data_dir), task, config, DATA_VERSION)
  if not epath.Path(path).exists():
    raise DataError(f"no built data at {path}: build it with python -m tasks.prepare --task={task} "
                    f"--data_dir={data_dir} and the spec, modality, row length and variant flags that name {config}")
  builder = tfds.builder_from_directory(path)
  source = builder.as_data_source(split="test")
  examples = sorted((source[i] for i in range(len(source))), key=lambda e: int(e["row"]))
  rows = {name: np.stack([np.asarray(e[name]) for e in examples]) for name in examples[0] if name != "row"}
  if "tokens" in rows and "audio_codes" not in rows:  # token rows without codebook tables
    rows["audio_codes"] = np.zeros(rows["tokens"].shape + (0,), np.int32)
  return rows, dict(builder.info.metadata)


@dataclasses.dataclass
class TaskData:
  task: str
  modality: str
  rows: dict[str, np.ndarray]
  metadata: dict

  @property
  def protocol(self) -> str:
    return self.metadata.get("protocol", "s2sbench")

  @property
  def label(self) -> str:
    """What it is scored as, in file names and keys: `s2s`, or `s2s_utterance` for the other protocol."""
    return modalities.label(self.modality, self.protocol)

  @property
  def benchmark(self) -> benchmarks.Benchmark:
    return benchmarks.get(self.task)

  @property
  def shape(self) -> RowShape:
    return RowShape(**self.metadata["row_shape"])

  @property
  def parallel_streams(self) -> bool:
    """Rows of parallel streams (s2sjax/packing.py's `stream_tokens`, a parallel_streams spec), not of tokens."""
    return "stream_tokens" in self.rows

  @property
  def num_rows(self) -> int:
    return len(self.rows["segment_ids"])

  @functools.cached_property
  def questions(self) -> QuestionTable:
    return QuestionTable.from_records(self.metadata["questions"], where=f"{self.task}/{self.modality}")

  @functools.cached_property
  def fingerprint(self) -> str:
    """A hash of what is scored (tokens, audio codes, targets): results saved for other rows are not these."""
    digest = hashlib.sha256()
    scored = (("stream_tokens", "target_pos", "target_frame", "target_weight") if self.parallel_streams
              else ("tokens", "audio_codes", "target_pos", "target_ids"))
    for name in scored + ("target_slot", "slot_item", "slot_candidate"):
      digest.update(np.ascontiguousarray(self.rows[name]).tobytes())
    return digest.hexdigest()[:16]


def load_task_data(data_dir: str, task: str, modality: str, spec: str, row_length: int | None,
                   variants: Variants = Variants()) -> TaskData:
  rows, metadata = load_rows(data_dir, task, config_name(spec, modality, row_length, variants))
  return TaskData(task, modalities.get(modality).name, rows, metadata)
