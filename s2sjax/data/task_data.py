"""Built task data as the evaluator reads it: the packed rows, the question table and the build's metadata.

`tasks.prepare` writes one TFDS config per task x spec x modality x row length x variant (`demo-s2t-1024`,
`-noshare`, ...) under `<data_dir>/<task>/<config>/<version>`; the names are `s2sjax.data.builds.DataSelector`'s, so the
build and the reader cannot disagree. Reading needs no TensorFlow (array_record through TFDS's data source).

Built data carries its own integrity, as checkpoints do: the build records what it is (`DataSelector.record`: task,
modality, spec, row length, variants) and checksums of its rows and of its question table (`integrity`), and the
reader holds the folder to both: a folder copied under another config's name, a damaged shard or an edited
`metadata.json` is refused by name (`verify=False`, `--noverify_data`, skips the checksums on a trusted bucket).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os

import numpy as np
from etils import epath

from s2sjax.data import task_registry, modalities
from s2sjax.data.builds import BuildMetadata, DataError, DataSelector, Variants
from s2sjax.data.modalities import Label
from s2sjax.runtime.output_dir import strict_json
from s2sjax.data.packing import RowShape
from s2sjax.data.questions import QuestionTable
from s2sjax.data.rows import RowFormat

# 1.1.0: stream rows' S->S targets carry the protocol's stream weights (100 semantic, 1 acoustic), not semantic-only
DATA_VERSION = "1.1.0"


class MissingDataError(DataError):
  """No build at all where one was asked for (the embedded default builds it then)."""


def questions_checksum(records: list[dict]) -> str:
  """A hash of the question table as metadata.json holds it (which candidate is right, where each one lies)."""
  return hashlib.sha256(strict_json(records, "the question table", sort_keys=True, ensure_ascii=False).encode()
                        ).hexdigest()


def _shard_problems(builder, read: bool = False) -> list[str]:
  """Each shard of the split that is missing, or holds fewer records than the build wrote (truncated); with
  `read`, also each whose records do not read back (a damaged chunk: array_record hashes its chunks)."""
  from array_record.python.array_record_module import ArrayRecordReader

  split = builder.info.splits["test"]
  problems = []
  for shard, expected in zip(split.filepaths, split.shard_lengths):
    name = os.path.basename(str(shard))
    if not epath.Path(shard).exists():
      problems.append(f"{name} is missing")
      continue
    try:
      reader = ArrayRecordReader(str(shard))
      found = reader.num_records()
      if read:
        reader.read_all()
    except (RuntimeError, ValueError, OSError) as e:
      problems.append(f"{name} cannot be read ({_first_line(e)})")
      continue
    if found != expected:
      problems.append(f"{name} holds {found} rows, the build wrote {expected} (truncated)")
  return problems


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [""])[0][:200]


def _rebuild_hint(task: str, data_dir: str, config: str) -> str:
  return (f"rebuild it with python -m tasks.prepare --task={task} --data_dir={data_dir} --overwrite and the flags "
          f"that name {config}")


def load_rows(data_dir: str, task: str, config: str,
              verify: bool = True) -> tuple[dict[str, np.ndarray], BuildMetadata]:
  """All packed rows of a built task/config, in row order, and its metadata; with `verify`, the rows and the
  question table are held to the checksums written with the build. A missing, truncated or unreadable shard is
  one error naming the file."""
  import tensorflow_datasets as tfds

  path = os.path.join(str(data_dir), task, config, DATA_VERSION)
  if not epath.Path(path).exists():
    raise MissingDataError(f"no built data at {path}: build it with python -m tasks.prepare --task={task} "
                           f"--data_dir={data_dir} and the spec, modality, row length and variant flags that name "
                           f"{config}")
  hint = _rebuild_hint(task, data_dir, config)
  try:
    builder = tfds.builder_from_directory(path)
  except Exception as e:  # a missing or truncated dataset_info.json / features.json / metadata.json
    raise DataError(f"{path} is not a readable build ({type(e).__name__}: {_first_line(e)}): {hint}") from None
  problems = _shard_problems(builder)
  if problems:
    raise DataError(f"{path} is damaged: shard {'; shard '.join(problems)}: {hint}")
  try:
    source = builder.as_data_source(split="test")
    examples = sorted((source[i] for i in range(len(source))), key=lambda e: int(e["row"]))
  except Exception as e:  # array_record's and TFDS's errors for damaged shards name no file: find the shard
    problems = _shard_problems(builder, read=True) or [f"? ({type(e).__name__}: {_first_line(e)})"]
    raise DataError(f"{path} is damaged: shard {'; shard '.join(problems)}: {hint}") from None
  if not examples:
    raise DataError(f"{path} holds no rows: {hint}")
  rows = {name: np.stack([np.asarray(e[name]) for e in examples]) for name in examples[0] if name != "row"}
  metadata = BuildMetadata.from_json(dict(builder.info.metadata), where=f"{path}/metadata.json")
  integrity, row_format = metadata.integrity, metadata.spec.row_format
  if metadata.build is None or integrity is None:
    raise DataError(f"{path}/metadata.json records no {'build' if metadata.build is None else 'checksums'} (not a "
                    f"build of this version): {hint}")
  if verify:
    if row_format.checksum(rows) != integrity.get("rows"):
      raise DataError(f"{path}: the rows differ from the checksum written with the build (a damaged or replaced "
                      f"shard): {hint}; --noverify_data reads them anyway")
    if questions_checksum(list(metadata.questions)) != integrity.get("questions"):
      raise DataError(f"{path}/metadata.json: the question table differs from the checksum written with the build "
                      f"(edited or damaged: which candidate is right is no longer what was built): {hint}; "
                      "--noverify_data reads it anyway")
  return row_format.completed(rows), metadata  # token rows without codebook tables: codes of width 0


@dataclasses.dataclass
class TaskData:
  task: str
  modality: str
  rows: dict[str, np.ndarray]
  metadata: BuildMetadata

  @property
  def protocol(self) -> str:
    return self.metadata.variants.protocol

  @property
  def label(self) -> Label:
    """What it is scored as, in file names and keys: `s2s`, or `s2s_utterance` for the other protocol."""
    return Label(self.modality, self.protocol)

  @property
  def benchmark(self) -> task_registry.Task:
    return task_registry.get(self.task)

  @property
  def shape(self) -> RowShape:
    return self.metadata.row_shape

  @property
  def row_format(self) -> RowFormat:
    """The format of the rows (s2sjax/data/rows.py), as the build's spec lays them: token rows, or stream rows."""
    return self.metadata.spec.row_format

  @property
  def num_rows(self) -> int:
    return len(self.rows["segment_ids"])

  @functools.cached_property
  def questions(self) -> QuestionTable:
    return QuestionTable.from_records(list(self.metadata.questions), where=f"{self.task}/{self.modality}")

  @functools.cached_property
  def fingerprint(self) -> str:
    """A hash of what is scored (tokens, audio codes, targets): results saved for other rows are not these."""
    digest = hashlib.sha256()
    for name in self.row_format.fingerprint_fields:
      digest.update(np.ascontiguousarray(self.rows[name]).tobytes())
    return digest.hexdigest()[:16]


def load_build(data_dir: str, selector: DataSelector, verify: bool = True) -> TaskData:
  """The build `selector` names, refused when the folder holds another build (copied or moved under this name)
  or, with `verify`, when its rows or question table differ from their checksums."""
  task, asked = selector.task, selector.record()
  rows, metadata = load_rows(data_dir, task, selector.config, verify)
  recorded = metadata.build
  differ = [f"{key} {recorded.get(key)!r}, not {value!r}" for key, value in asked.items()
            if key != "config" and recorded.get(key) != value]
  if differ:
    path = os.path.join(str(data_dir), task, selector.config, DATA_VERSION)
    title = lambda record: modalities.title(record["modality"]) if record.get("modality") in modalities.NAMES else "?"
    raise DataError(f"{path} holds the build {recorded.get('task')}/{recorded.get('config')} ({title(recorded)}), "
                    f"not the {task}/{selector.config} ({title(asked)}) asked for "
                    f"({'; '.join(differ)}): a folder copied or moved under another name. "
                    f"{_rebuild_hint(task, data_dir, selector.config).capitalize()}")
  return TaskData(task, selector.modality, rows, metadata)


def load_task_data(data_dir: str, task: str, modality: str, spec: str, row_length: int | None,
                   variants: Variants = Variants(), verify: bool = True) -> TaskData:
  """`load_build` of the selector these name (the Python API's spelling)."""
  return load_build(data_dir, DataSelector(task, modality, spec, row_length, variants), verify)
