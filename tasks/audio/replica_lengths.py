r"""How long the replica's recordings are (`tasks.importer`'s S2SBench replica, 2026's public sources): the
distribution a device check and the shape policy's tests draw synthetic recordings from, shipped as a small
manifest (`replica_lengths.json`) so that neither needs the replica itself.

Where the numbers come from: every distinct text the importer speaks (each task's spoken prefixes and spoken
candidates, read from the public sources with the importer's own readers; tStoryCloze speaks nothing of its own)
times the seconds per character espeak-ng took on them, the medians the importer reported
(docs/benchmarks/README.md, "The sStoryCloze replica": en 0.057 s, cmn 0.35 s). Lengths are binned to
BIN_SECONDS; the manifest says how many recordings of each task and role fall in each bin.

  python -m tasks.audio.replica_lengths --output=tasks/audio/replica_lengths.json \
      --storycloze_csv="cloze_test_test__spring2016 - cloze_test_ALL_test.csv" \
      --xstorycloze_zh=spring2016.val.zh.tsv.split_20_80_train.tsv,spring2016.val.zh.tsv.split_20_80_eval.tsv \
      --cmmlu_dir=CMMLU/data/test
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np

MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replica_lengths.json")
SECONDS_PER_CHARACTER = {"en": 0.057, "cmn": 0.35}  # the importer's medians (docs/benchmarks/README.md)
BIN_SECONDS = 0.25
SAMPLE_RATE = 16000  # the replica's recordings (tasks/speech.py)


def manifest_from_texts(texts: dict[tuple[str, str, str], set[str]]) -> dict:
  """{(task, role, language): distinct texts} -> the manifest: per "task/role", [[seconds, recordings], ...] with
  seconds the upper edge of a BIN_SECONDS bin, and the totals."""
  bins = {}
  total_seconds = total_recordings = 0
  for (task, role, language), spoken in sorted(texts.items()):
    seconds = np.array([len(t) for t in spoken]) * SECONDS_PER_CHARACTER[language]
    edges = np.maximum(1, np.ceil(seconds / BIN_SECONDS)).astype(int)
    counts = collections.Counter(edges.tolist())
    bins[f"{task}/{role}"] = [[round(edge * BIN_SECONDS, 2), n] for edge, n in sorted(counts.items())]
    total_seconds += float(seconds.sum())
    total_recordings += len(spoken)
  return {"source": "tasks.importer's replica texts x espeak-ng's median seconds per character",
          "seconds_per_character": SECONDS_PER_CHARACTER, "bin_seconds": BIN_SECONDS,
          "recordings": total_recordings, "audio_hours": round(total_seconds / 3600, 1), "bins": bins}


def load(path: str = MANIFEST) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def durations(manifest: dict | None = None) -> np.ndarray:
  """Every recording's length in seconds (its bin's upper edge), all tasks and roles."""
  manifest = manifest or load()
  return np.array([seconds for rows in manifest["bins"].values() for seconds, n in rows for _ in range(n)])


def sample(count: int, seed: int = 0, manifest: dict | None = None) -> np.ndarray:
  """`count` lengths in seconds drawn from the replica's recordings (without replacement), seeded."""
  every = durations(manifest)
  return np.random.default_rng(seed).choice(every, size=count, replace=False)


def synthetic_waves(seconds: np.ndarray, sample_rate: int = SAMPLE_RATE, seed: int = 0) -> list[np.ndarray]:
  """Noise recordings of these lengths (a tokenizer's cost depends on the length alone), within full scale."""
  rng = np.random.default_rng(seed)
  return [(0.1 * rng.standard_normal(int(s * sample_rate))).astype(np.float32) for s in seconds]


def main(argv):
  del argv
  from absl import flags

  from tasks import importer
  from tasks.release import spoken_candidates

  flags_ = flags.FLAGS
  texts: dict[tuple[str, str, str], set[str]] = {}

  def add(task: str, language: str, lines: list[dict]) -> None:
    texts[(task, "prefixes", language)] = {line["first"] for line in lines}
    texts[(task, "candidates", language)] = {t for line in lines for t in spoken_candidates(task, line).values()}

  if flags_.storycloze_csv:
    add("sstorycloze", "en", importer.story_lines(importer.read_stories(flags_.storycloze_csv, ","), " "))
  if flags_.xstorycloze_zh:
    stories = [s for path in flags_.xstorycloze_zh for s in importer.read_stories(path, "\t")]
    add("zh_sstorycloze", "cmn", importer.story_lines(stories, ""))
  if flags_.cmmlu_dir:
    kept = importer.read_cmmlu(flags_.cmmlu_dir)[0]
    add("scmmlu", "cmn", [dict(line, uttid=k) for k, line in enumerate(kept)])
  manifest = manifest_from_texts(texts)
  with open(flags_.output, "w", encoding="utf-8") as f:
    json.dump(manifest, f, separators=(",", ":"))
    f.write("\n")
  print(f"{manifest['recordings']:,} recordings, {manifest['audio_hours']} audio hours -> {flags_.output}")


if __name__ == "__main__":
  from absl import flags

  from s2sjax.runtime import cli

  flags.DEFINE_string("storycloze_csv", None, "StoryCloze Spring 2016 test CSV.")
  flags.DEFINE_list("xstorycloze_zh", [], "XStoryCloze zh TSVs.")
  flags.DEFINE_string("cmmlu_dir", None, "CMMLU's test folder of subject CSVs.")
  flags.DEFINE_string("output", MANIFEST, "Where the manifest is written.")
  cli.run(main)
