r"""Tokenizes a folder of recordings once, into the `precomputed` layout: `<stem>.npy`, int32 [frames, codebooks].

  python -m tasks.audio.tokenize --audio_tokenizer=glm4_voice --audio_tokenizer_dir=glm-4-voice-tokenizer \
      --input=wavs/ --output=codes/
  python -m tasks.audio.tokenize --spec=twist --audio_tokenizer_dir=units/ --input=wavs/ --output=codes/
  python -m tasks.audio.tokenize ... --compare=their_codes/   # how many codes equal codes made elsewhere

The tokenizer is a type of the registry (`tasks.audio.TOKENIZERS`) with settings given as `--setting=KEY=VALUE`,
or a spec's `audio_tokenizer` (`--spec`). Recordings at another rate are resampled and multichannel ones mixed
down (both counted); a cut or empty file stops the run naming it, or with `--skip_bad` is left out and listed.
With `--dtype=bfloat16` the codes' agreement with fp32 is printed too. A summary goes to `<output>/tokenize.json`.

One folder holds one tokenizer's codes: `--output` may be new, empty, or made by the same tokenizer, settings and
dtype (its `tokenize.json` says so; a rerun rewrites its files). A folder of other codes is refused before anything
is tokenized; `--overwrite` replaces it whole (the new codes written beside it and swapped in complete), and only
a folder that holds nothing but codes and `tokenize.json`.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import time

import numpy as np
import yaml
from absl import flags

from s2sjax.runtime import cli
from s2sjax.runtime.errors import MissingFileError, UserError
from s2sjax.runtime.staging import owner_tag, swap_into_place
from s2sjax.data.spec import load_spec
from tasks import audio
from tasks.audio.base import AudioError, load_audio, resamplings
from tasks.audio.jax_tokenizer import FLOAT_DTYPES
from tasks.audio.precomputed import read_codes

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
SUMMARY = "tokenize.json"


class TokenizeError(UserError, ValueError):
  """A flag or folder this command cannot use (--audio_tokenizer or --spec, --setting, --input, --compare)."""


def tokenizer_settings(kind: str | None, spec: str | None, settings: list[str]) -> tuple[dict, tuple[int, ...]]:
  """(settings, codebook sizes) from a spec, or from a type and KEY=VALUE pairs (values read as YAML scalars)."""
  if (kind is None) == (spec is None):
    raise TokenizeError("give one of --audio_tokenizer (a type: " + ", ".join(audio.TOKENIZERS.names()) + ") or --spec")
  loaded = load_spec(spec) if spec else None
  chosen = dict(loaded.audio_tokenizer) if loaded else {"type": kind}
  for pair in settings:
    key, sep, value = pair.partition("=")
    if not sep or not key:
      raise TokenizeError(f"--setting {pair!r}: expected KEY=VALUE")
    chosen[key] = yaml.safe_load(value)
  audio.TOKENIZERS.get(chosen["type"])  # an unknown type is named before anything is read
  return chosen, (tuple(loaded.codebook_sizes) if loaded else None)


def recordings(folder: str) -> list[str]:
  if not os.path.isdir(folder):
    raise MissingFileError(f"--input {folder} is not a folder")
  found = sorted(n for n in os.listdir(folder) if n.lower().endswith(AUDIO_SUFFIXES))
  if not found:
    raise TokenizeError(f"--input {folder} holds no audio file ({', '.join(AUDIO_SUFFIXES)})")
  return found


def load_codes(folder: str, stems: list[str], codebook_sizes: tuple[int, ...]) -> dict[str, np.ndarray]:
  """`<stem>.npy` codes made elsewhere, [frames, codebooks], for the stems that have a file."""
  paths = {stem: os.path.join(folder, f"{stem}.npy") for stem in stems}
  return {stem: read_codes(path, codebook_sizes) for stem, path in paths.items() if os.path.exists(path)}


def agreement(mine: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> dict:
  """Frames equal in every codebook (over the longer of the two), and files equal whole, for the stems in both."""
  stems = [s for s in mine if s in theirs]
  for stem in stems:
    if theirs[stem].shape[1:] != mine[stem].shape[1:]:
      raise TokenizeError(f"{stem}: the other codes are [frames, {theirs[stem].shape[1]}], ours [frames, "
                          f"{mine[stem].shape[1]}]")
  same = lambda a, b: int((a[: len(b)] == b[: len(a)]).all(-1).sum())
  return {"frames_equal": sum(same(mine[s], theirs[s]) for s in stems),
          "frames": sum(max(len(mine[s]), len(theirs[s])) for s in stems),
          "files_equal": sum(int(mine[s].shape == theirs[s].shape and (mine[s] == theirs[s]).all()) for s in stems),
          "files_compared": len(stems), "files_missing": len(mine) - len(stems)}


def output_plan(folder: str, made_by: dict, overwrite: bool) -> bool:
  """Whether the codes are to replace `folder` whole (else they are written into it), or a TokenizeError: a folder
  holding other codes than `made_by`'s without --overwrite, or other files than codes with it."""
  if not os.path.isdir(folder) or not os.listdir(folder):
    return False
  summary_path = os.path.join(folder, SUMMARY)
  try:
    with open(summary_path, encoding="utf-8") as f:
      found = json.load(f).get("tokenizer")
  except (OSError, ValueError, AttributeError):
    found = None
  if not overwrite:
    if found == made_by:
      return False
    made = (f"codes of {found.get('type')} (fingerprint {found.get('fingerprint')}, dtype {found.get('dtype')})"
            if isinstance(found, dict) else f"files but no readable {SUMMARY} (codes of unknown making)")
    raise TokenizeError(f"--output {folder} holds {made}, not of this tokenizer ({made_by['type']}, fingerprint "
                        f"{made_by['fingerprint']}, dtype {made_by['dtype']}): one folder holds one tokenizer's "
                        "codes; choose another folder, or --overwrite to replace it whole")
  strangers = sorted(n for n in os.listdir(folder) if n != SUMMARY and not (
      n.endswith(".npy") and os.path.isfile(os.path.join(folder, n))))
  if strangers:
    raise TokenizeError(f"--output {folder} holds more than codes ({', '.join(strangers[:5])}): --overwrite replaces "
                        "only a folder of codes and its tokenize.json")
  return True


def _from_to(resampled: dict[str, int]) -> str:
  return f" ({', '.join(f'{n} from {rates} Hz' for rates, n in resampled.items())})" if resampled else ""


def main(argv):
  del argv
  settings, codebook_sizes = tokenizer_settings(FLAGS.audio_tokenizer, FLAGS.spec, FLAGS.setting)
  tokenizer = audio.from_spec(settings, codebook_sizes, FLAGS.audio_tokenizer_dir, FLAGS.dtype, FLAGS.mesh)
  made_by = dict(tokenizer.identity(), fingerprint=tokenizer.fingerprint(), dtype=FLAGS.dtype)
  made_by = json.loads(json.dumps(made_by))  # as tokenize.json holds it (tuples as lists)
  replace = output_plan(FLAGS.output, made_by, FLAGS.overwrite)
  names = recordings(FLAGS.input)
  counts, skipped, waves, stems = collections.Counter(), {}, [], []
  for name in names:
    try:
      waves.append(load_audio(os.path.join(FLAGS.input, name), tokenizer.sample_rate, counts))
      stems.append(os.path.splitext(name)[0])
    except AudioError as e:
      if not FLAGS.skip_bad:
        raise
      skipped[name] = str(e)
  start = time.time()
  encoded = dict(zip(stems, tokenizer.encode_batch(waves, stems, progress=f"tokenizing ({settings['type']})")))
  seconds = time.time() - start
  audio_seconds = sum(len(w) for w in waves) / tokenizer.sample_rate
  summary = {"tokenizer": made_by, "files": len(encoded),
             "skipped": skipped, "resampled": counts["resampled"], "resampled_from_to": resamplings(counts),
             "mixed_down": counts["mixed_down"],
             "audio_seconds": round(audio_seconds, 2), "seconds": round(seconds, 2),
             "audio_seconds_per_second": round(audio_seconds / max(seconds, 1e-9), 1)}
  if FLAGS.dtype != "float32":
    reference = audio.from_spec(settings, codebook_sizes, FLAGS.audio_tokenizer_dir, "float32", FLAGS.mesh)
    summary["agreement_with_float32"] = agreement(encoded, dict(zip(stems, reference.encode_batch(waves))))
  if FLAGS.compare:
    summary["compare"] = agreement(encoded, load_codes(FLAGS.compare, stems, tokenizer.codebook_sizes))
  write_codes(FLAGS.output, encoded, summary, replace)
  print(f"{len(encoded)} files, {audio_seconds:,.1f} audio s in {seconds:,.1f}s "
        f"({summary['audio_seconds_per_second']:,} audio s/s) -> {FLAGS.output}; resampled {counts['resampled']}"
        f"{_from_to(summary['resampled_from_to'])}, mixed down {counts['mixed_down']}, skipped {len(skipped)}")
  for key in ("agreement_with_float32", "compare"):
    if key in summary:
      found = summary[key]
      print(f"{key}: {found['frames_equal']:,}/{found['frames']:,} frames equal, "
            f"{found['files_equal']}/{found['files_compared']} files identical")


def write_codes(folder: str, encoded: dict[str, np.ndarray], summary: dict, replace: bool) -> None:
  """`<stem>.npy` per recording and tokenize.json, into `folder`, or (`replace`) into a folder beside it that is
  then swapped in whole: a run that fails leaves the old folder as it was."""
  parent, name = os.path.split(os.path.abspath(folder))
  tag = owner_tag()
  target = os.path.join(parent, f".{name}.tokenize-{tag}") if replace else folder
  os.makedirs(target, exist_ok=True)
  try:
    for stem, codes in encoded.items():
      np.save(os.path.join(target, f"{stem}.npy"), codes.astype(np.int32))
    with open(os.path.join(target, SUMMARY), "w") as f:
      json.dump(summary, f, indent=2, allow_nan=False)
    if replace:
      swap_into_place(target, folder, tag)
  finally:
    if replace:
      shutil.rmtree(target, ignore_errors=True)


FLAGS = flags.FLAGS

if __name__ == "__main__":
  with cli.setting_up():
    flags.DEFINE_string("audio_tokenizer", None, "Tokenizer type: " + ", ".join(audio.TOKENIZERS.names()) + ".")
  flags.DEFINE_string("spec", None, "Take the tokenizer and its settings from this spec (e.g. glm4_voice, twist).")
  flags.DEFINE_multi_string("setting", [], "KEY=VALUE settings of the tokenizer (layer=11, codebooks=8, ...).")
  flags.DEFINE_string("audio_tokenizer_dir", None, "The tokenizer's files (the release folder).")
  flags.DEFINE_string("input", None, "A folder of recordings (.wav, .flac, .ogg, .mp3).")
  flags.DEFINE_string("output", None, "Where <stem>.npy codes and tokenize.json are written.")
  flags.DEFINE_string("compare", None, "A folder of <stem>.npy codes made elsewhere: print how many equal ours.")
  flags.DEFINE_enum("dtype", "float32", FLOAT_DTYPES, "Compute dtype; bfloat16 also prints its agreement with fp32.")
  flags.DEFINE_string("mesh", "data:-1", "Devices the batches are split over (data axis only).")
  flags.DEFINE_bool("skip_bad", False, "Leave out (and list) recordings that cannot be read, instead of stopping.")
  flags.DEFINE_bool("overwrite", False, "Replace --output whole when it holds another tokenizer's codes.")
  flags.mark_flags_as_required(["input", "output"])
  cli.run(main)
