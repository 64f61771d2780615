"""Builds the packed rows of one S2SBench task for one selector (`prepare_build`; `prepare` for the Python API's
spelling), as `python -m tasks.prepare` does (the command line: `s2sjax/commands/prepare.py`).

Built data is reused only when it was built from the same inputs (release files, spec, text and audio
tokenizers); otherwise prepare refuses, unless `overwrite`, which builds the new data beside the old (a hidden
`.rebuild-*` folder of the data dir) and swaps it in only once it is complete: a rebuild that fails leaves the
earlier build as it was. Two runs building one config into one data dir at once take turns: the second waits for
the first's build (a lock beside it names the holder) and reuses it.
"""

from __future__ import annotations

import os
import shutil

import tensorflow_datasets as tfds

from s2sjax.runtime import cache
from s2sjax.data import text_tokenizer
from s2sjax.data.builds import BuildMetadata, DataSelector, Variants
from s2sjax.runtime.errors import UserError
from s2sjax.runtime.output_dir import LOCK_NAME, waiting_lock
from s2sjax.runtime.staging import owner_tag, remove_dead, swap_into_place
from tasks.tfds_builder import builder_class, make_config, resolve_manual_dir, resolve_tokenizer_dir

INPUT_NAMES = {"release": "the release files", "spec": "the spec", "text_tokenizer": "the text tokenizer",
               "audio_tokenizer": "the audio tokenizer"}


class StaleDataError(UserError, ValueError):
  """Built data exists for a config but came from other inputs than the ones given now."""


def default_data_dir() -> str:
  """`data/` of the cache the embedded default lives in ($S2SJAX_CACHE)."""
  return os.path.join(cache.cache_dir(), "data")


def prepare(task: str, spec: str, modality: str, row_length: int | None, data_dir: str, manual_dir: str | None = None,
            overwrite: bool = False, variants: Variants = Variants(), **builder_kwargs) -> BuildMetadata:
  """`prepare_build` of the selector these name (the Python API's spelling)."""
  return prepare_build(DataSelector(task, modality, spec, row_length, variants), data_dir, manual_dir, overwrite,
                       **builder_kwargs)


def prepare_build(selector: DataSelector, data_dir: str, manual_dir: str | None = None, overwrite: bool = False,
                  **builder_kwargs) -> BuildMetadata:
  """Builds what `selector` names, or reuses it when it was built from the same inputs; returns its metadata.
  builder_kwargs: tokenizer_dir, audio_tokenizer_dir, skip_bad, trust_remote_code, max_item_tokens, audio_shapes."""
  task = selector.task
  manual_dir = resolve_manual_dir(manual_dir)
  config, builder_kwargs = _config(selector, manual_dir, builder_kwargs)
  name = config if isinstance(config, str) else config.name
  with _build_lock(builder_class(task)(config=config, data_dir=data_dir, **builder_kwargs), task, name):
    # made again under the lock: a build another run finished while this one waited is found, and reused
    builder = builder_class(task)(config=config, data_dir=data_dir, **builder_kwargs)
    return _prepare_locked(builder, task, name, config, data_dir, manual_dir, overwrite, builder_kwargs)


def will_build(selector: DataSelector, data_dir: str, manual_dir: str | None = None, overwrite: bool = False,
               **builder_kwargs) -> bool:
  """Whether `prepare_build` with these arguments builds (True) or reuses a finished build (False), raising its
  StaleDataError for a build made from other inputs: what process 0 of a distributed `tasks.prepare` tells the
  others, which build beside it only what it builds."""
  manual_dir = resolve_manual_dir(manual_dir)
  config, builder_kwargs = _config(selector, manual_dir, builder_kwargs)
  builder = builder_class(selector.task)(config=config, data_dir=data_dir, **builder_kwargs)
  if overwrite or not builder.is_prepared():
    return True
  _refuse_stale(builder, selector.task, builder.builder_config.name, data_dir, manual_dir)
  return False


def _config(selector: DataSelector, manual_dir: str, builder_kwargs: dict):
  """(the TFDS config of the selector's build, the builder's arguments with its plan), once the text tokenizer a
  spec reads is known to be trusted (refused before the builder writes anything)."""
  plan = selector.resolve()
  if plan.spec.text_vocabulary:
    text_tokenizer.check_trusted(resolve_tokenizer_dir(builder_kwargs.get("tokenizer_dir"), manual_dir),
                                 builder_kwargs.get("trust_remote_code", False))
  config = make_config(plan)
  if config.name in {c.name for c in builder_class(selector.task).BUILDER_CONFIGS}:
    config = config.name  # TFDS refuses a custom config named like a predefined one; names say everything
  return config, dict(builder_kwargs, plan=plan)  # the spec as read now, whatever config object TFDS holds


def _build_lock(builder, task: str, name: str):
  """One build of a config into a data dir at a time: `<data_dir>/<task>/.<config>.s2sjax-lock` (holder named, as
  the output directory's lock; one left by a dead run of this host is taken over). A second run waits for the
  first and reuses its build; TFDS would fail it at the rename of its finished build."""
  config_dir = os.path.dirname(str(builder.data_dir))  # <data_dir>/<task>/<config>/<version>
  return waiting_lock(os.path.dirname(config_dir), f".{os.path.basename(config_dir)}{LOCK_NAME}", f"{task}/{name}",
                      "build")


def _prepare_locked(builder, task: str, name: str, config, data_dir: str, manual_dir: str, overwrite: bool,
                    builder_kwargs: dict) -> BuildMetadata:
  if builder.is_prepared() and not overwrite:
    _refuse_stale(builder, task, name, data_dir, manual_dir)
  _remove_dead_rebuilds(data_dir)
  if builder.is_prepared() and overwrite:
    return _rebuild_beside(builder, task, config, data_dir, manual_dir, builder_kwargs)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
    manual_dir=manual_dir, download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))
  return built_metadata(builder)


def _refuse_stale(builder, task: str, name: str, data_dir: str, manual_dir: str) -> None:
  """A StaleDataError when the finished build was made from other inputs than these."""
  previous = built_metadata(builder)
  built = previous.inputs or {}  # none recorded: not a build of this version, every input differs
  now = builder.build_inputs(manual_dir).fingerprint
  differ = [INPUT_NAMES[k] for k in now if built.get(k) != now[k]]
  if differ:
    raise StaleDataError(
      f"{task}/{name} in {data_dir} was built from other inputs ({', '.join(differ)} changed; built from "
      f"{previous.source}, now {manual_dir}): pass --overwrite to rebuild it, or use another --data_dir")


def built_metadata(builder) -> BuildMetadata:
  """The metadata a finished build wrote."""
  return BuildMetadata.from_json(dict(builder.info.metadata), where=f"{builder.data_dir}/metadata.json")


REBUILD_PREFIX = ".rebuild-"  # a hidden data dir of the data dir, `.rebuild-<owner tag>` (s2sjax/runtime/staging.py)


def _rebuild_beside(old, task: str, config, data_dir: str, manual_dir: str, builder_kwargs: dict) -> BuildMetadata:
  """--overwrite of a finished build: the new one is built in a hidden data dir beside it, then swapped into the
  old one's place (`staging.swap_into_place`). TFDS's own overwrite deletes the old build first, so a rebuild that
  failed (a bad wav) lost the good one."""
  tag = owner_tag()
  staging = os.path.join(data_dir, f"{REBUILD_PREFIX}{tag}")
  try:
    builder = builder_class(task)(config=config, data_dir=staging, **builder_kwargs)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    metadata = built_metadata(builder)
    swap_into_place(builder.data_dir, old.data_dir, tag)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return metadata


def _remove_dead_rebuilds(data_dir: str) -> None:
  """Rebuild folders left by prepare runs of this host that were killed (their pid is gone)."""
  remove_dead(data_dir, REBUILD_PREFIX)
