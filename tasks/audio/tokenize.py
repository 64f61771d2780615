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
dtype (its `tokenize.json`, written before the first code, says so). A folder of other codes is refused before
anything is tokenized; `--overwrite` replaces it whole (the new codes written beside it and swapped in complete),
and only a folder that holds nothing but codes and `tokenize.json`.

Codes are written as they are made (`--chunk_seconds` of audio at a time), each file renamed into place whole. A
run stopped by Ctrl-C (or killed) is resumed by the same command: it keeps every codes file of a recording
unchanged since (size and modification time, as tokenize.json recorded them), tokenizes the rest, and says how
many it kept. JAX tokenizers pad batches by `--shapes` (tasks/audio/jax_tokenizer.py); the summary says how many
programs were compiled, in how many seconds, and how many the persistent compilation cache gave instead.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import time

import numpy as np
import yaml
from absl import flags

from s2sjax.runtime import cli
from s2sjax.runtime.errors import MissingFileError, UserError
from s2sjax.runtime.progress import Progress
from s2sjax.runtime.staging import owner_tag, swap_into_place
from s2sjax.data.spec import load_spec
from tasks import audio
from tasks.audio.base import AudioError, load_audio, resamplings
from tasks.audio.jax_tokenizer import FLOAT_DTYPES, SHAPE_POLICIES, compile_line, jax_part
from tasks.audio.precomputed import read_codes

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
SUMMARY = "tokenize.json"
PARTIAL = ".partial"  # the suffix of a file being written beside its place (hidden: a leading dot)


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
  if not os.path.isdir(folder) or not [n for n in os.listdir(folder) if not n.endswith(PARTIAL)]:
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
  strangers = sorted(n for n in os.listdir(folder) if n != SUMMARY and not n.endswith(PARTIAL) and not (
      n.endswith(".npy") and os.path.isfile(os.path.join(folder, n))))
  if strangers:
    raise TokenizeError(f"--output {folder} holds more than codes ({', '.join(strangers[:5])}): --overwrite replaces "
                        "only a folder of codes and its tokenize.json")
  return True


def _from_to(resampled: dict[str, int]) -> str:
  return f" ({', '.join(f'{n} from {rates} Hz' for rates, n in resampled.items())})" if resampled else ""


def recording_stamps(folder: str, names: list[str]) -> dict[str, list[int]]:
  """{recording name: [bytes, modification time in ns]}: what says a recording is the one its codes were made of."""
  stamps = {}
  for name in names:
    status = os.stat(os.path.join(folder, name))
    stamps[name] = [status.st_size, status.st_mtime_ns]
  return stamps


def kept_codes(folder: str, made_by: dict, stamps: dict[str, list[int]],
               codebook_sizes: tuple[int, ...]) -> dict[str, np.ndarray]:
  """The codes an earlier run of the same tokenizer (finished or stopped) left in `folder` for recordings unchanged
  since (their stamps are the ones its tokenize.json recorded). Codes files are renamed into place whole, so one
  that is there is complete; one that cannot be read is made again."""
  summary = _read_summary(folder)
  if summary.get("tokenizer") != made_by:
    return {}
  recorded = summary.get("recordings") or {}
  kept = {}
  for name, stamp in stamps.items():
    stem = os.path.splitext(name)[0]
    path = os.path.join(folder, f"{stem}.npy")
    if recorded.get(name) == stamp and os.path.isfile(path):
      try:
        kept[stem] = read_codes(path, codebook_sizes)
      except AudioError:
        continue
  return kept


def _read_summary(folder: str) -> dict:
  try:
    with open(os.path.join(folder, SUMMARY), encoding="utf-8") as f:
      found = json.load(f)
  except (OSError, ValueError):
    return {}
  return found if isinstance(found, dict) else {}


def chunks(lengths: list[int], samples: int) -> list[range]:
  """Consecutive index ranges of about `samples` samples of audio each (at least one recording)."""
  out, start, total = [], 0, 0
  for index, length in enumerate(lengths):
    total += length
    if total >= samples:
      out.append(range(start, index + 1))
      start, total = index + 1, 0
  if start < len(lengths):
    out.append(range(start, len(lengths)))
  return out


def main(argv):
  del argv
  settings, codebook_sizes = tokenizer_settings(FLAGS.audio_tokenizer, FLAGS.spec, FLAGS.setting)
  tokenizer = audio.from_spec(settings, codebook_sizes, FLAGS.audio_tokenizer_dir, FLAGS.dtype, FLAGS.mesh,
                              FLAGS.shapes)
  made_by = dict(tokenizer.identity(), fingerprint=tokenizer.fingerprint(), dtype=FLAGS.dtype)
  made_by = json.loads(json.dumps(made_by))  # as tokenize.json holds it (tuples as lists)
  replace = output_plan(FLAGS.output, made_by, FLAGS.overwrite)
  names = recordings(FLAGS.input)
  stamps = recording_stamps(FLAGS.input, names)
  kept = {} if replace else kept_codes(FLAGS.output, made_by, stamps, tokenizer.codebook_sizes)
  counts, skipped, waves, stems = collections.Counter(), {}, [], []
  for name in names:
    if os.path.splitext(name)[0] in kept:
      continue
    try:
      waves.append(load_audio(os.path.join(FLAGS.input, name), tokenizer.sample_rate, counts))
      stems.append(os.path.splitext(name)[0])
    except AudioError as e:
      if not FLAGS.skip_bad:
        raise
      skipped[name] = str(e)
  computes = jax_part(tokenizer)
  if computes is not None and waves:  # every chunk laid in the same windows
    computes.expected_longest_samples = max(len(w) for w in waves)
  with CodesFolder(FLAGS.output, replace, {"tokenizer": made_by, "complete": False, "recordings": stamps}) as out:
    start = time.time()
    encoded = _tokenize(tokenizer, waves, stems, settings["type"], out, len(kept))
    seconds = time.time() - start
    audio_seconds = sum(len(w) for w in waves) / tokenizer.sample_rate
    compiled = computes.run_report() if computes is not None else None
    summary = {"tokenizer": made_by, "complete": True, "recordings": stamps, "files": len(encoded) + len(kept),
               "kept": len(kept), "skipped": skipped, "resampled": counts["resampled"],
               "resampled_from_to": resamplings(counts), "mixed_down": counts["mixed_down"],
               "audio_seconds": round(audio_seconds, 2), "seconds": round(seconds, 2),
               "audio_seconds_per_second": round(audio_seconds / max(seconds, 1e-9), 1)}
    if compiled is not None:
      summary.update(shapes=computes.policy if waves else computes.shapes, compiled=compiled)
    everything = dict(kept, **encoded)
    if FLAGS.dtype != "float32":
      reference = audio.from_spec(settings, codebook_sizes, FLAGS.audio_tokenizer_dir, "float32", FLAGS.mesh,
                                  FLAGS.shapes)
      all_waves = waves + [load_audio(os.path.join(FLAGS.input, n), tokenizer.sample_rate) for n in names
                           if os.path.splitext(n)[0] in kept]
      all_stems = stems + [os.path.splitext(n)[0] for n in names if os.path.splitext(n)[0] in kept]
      summary["agreement_with_float32"] = agreement(
          {s: everything[s] for s in all_stems}, dict(zip(all_stems, reference.encode_batch(all_waves))))
    if FLAGS.compare:
      summary["compare"] = agreement(everything, load_codes(FLAGS.compare, list(everything),
                                                            tokenizer.codebook_sizes))
    out.finish(summary)
  kept_note = f" ({len(kept)} kept from an earlier run)" if kept else ""
  print(f"{summary['files']} files{kept_note}, {audio_seconds:,.1f} audio s in {seconds:,.1f}s "
        f"({summary['audio_seconds_per_second']:,} audio s/s) -> {FLAGS.output}; resampled {counts['resampled']}"
        f"{_from_to(summary['resampled_from_to'])}, mixed down {counts['mixed_down']}, skipped {len(skipped)}")
  if compiled is not None:
    print(compile_line(compiled, summary["shapes"]))
  for key in ("agreement_with_float32", "compare"):
    if key in summary:
      found = summary[key]
      print(f"{key}: {found['frames_equal']:,}/{found['frames']:,} frames equal, "
            f"{found['files_equal']}/{found['files_compared']} files identical")


def _tokenize(tokenizer, waves: list[np.ndarray], stems: list[str], kind: str, out: "CodesFolder",
              kept: int) -> dict[str, np.ndarray]:
  """Codes of each wave, written a chunk at a time (CHUNK_SECONDS of audio) so that a stopped run keeps what is
  done: the chunk is computed in a worker (`cli.in_worker`), its files written by this thread."""
  meter = Progress(len(waves), f"tokenizing ({kind})", unit="utterances", rate_unit="audio s")
  encoded: dict[str, np.ndarray] = {}
  try:
    for part in chunks([len(w) for w in waves], int(FLAGS.chunk_seconds * tokenizer.sample_rate)):
      part_stems = [stems[i] for i in part]
      codes = cli.in_worker(tokenizer.encode_batch, [waves[i] for i in part], part_stems, meter)
      for stem, each in zip(part_stems, codes):
        out.write(stem, each)
        encoded[stem] = each
  except cli.Interrupted as e:
    e.message = (f"stopped by {signal.Signals(e.signum).name}: {kept + len(encoded)} of {kept + len(waves)} "
                 f"recordings' codes are in {FLAGS.output}; rerun the same command to tokenize the rest")
    raise
  return encoded


class CodesFolder:
  """Where the codes go: `folder` itself, or (`replace`) a folder beside it swapped in whole at `finish`, so a run
  that fails leaves the old folder as it was. Its tokenize.json says from the start whose codes it holds (`begun`:
  a stopped run's rerun keeps them); each `<stem>.npy` is written beside its place and renamed into it whole."""

  def __init__(self, folder: str, replace: bool, begun: dict):
    self.folder, self.replace, self.begun = folder, replace, begun

  def __enter__(self) -> "CodesFolder":
    parent, name = os.path.split(os.path.abspath(self.folder))
    self.tag = owner_tag()
    self.target = os.path.join(parent, f".{name}.tokenize-{self.tag}") if self.replace else self.folder
    os.makedirs(self.target, exist_ok=True)
    for leftover in os.listdir(self.target):  # a killed run's half-written files
      if leftover.endswith(PARTIAL):
        os.remove(os.path.join(self.target, leftover))
    self._write_summary(self.begun)
    return self

  def write(self, stem: str, codes: np.ndarray) -> None:
    path = os.path.join(self.target, f"{stem}.npy")
    partial = os.path.join(self.target, f".{stem}.npy.{self.tag}{PARTIAL}")
    with open(partial, "wb") as f:
      np.save(f, codes.astype(np.int32))
    os.replace(partial, path)

  def finish(self, summary: dict) -> None:
    self._write_summary(summary)
    if self.replace:
      swap_into_place(self.target, self.folder, self.tag)

  def _write_summary(self, summary: dict) -> None:
    partial = os.path.join(self.target, f".{SUMMARY}.{self.tag}{PARTIAL}")
    with open(partial, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2, allow_nan=False)
    os.replace(partial, os.path.join(self.target, SUMMARY))

  def __exit__(self, *exc) -> None:
    if self.replace:
      shutil.rmtree(self.target, ignore_errors=True)


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
  flags.DEFINE_enum("shapes", "auto", SHAPE_POLICIES, "How JAX tokenizers pad batches: buckets (least padding, "
                    "many shapes), windows (a few fixed shapes), auto (buckets on a CPU, windows on accelerators).")
  flags.DEFINE_float("chunk_seconds", 600.0, "Audio tokenized between writes of codes: what a stop can lose.")
  flags.mark_flags_as_required(["input", "output"])
  cli.run(main)
