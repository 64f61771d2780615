r"""Writes the bundled sample from `source/*.json`: release-layout jsonl files (tStoryCloze drawn from the English
stories), espeak-ng speech of every `first` and of every candidate (16 kHz mono 16-bit), and the mel k-means
codebook fitted on the prefixes' speech.

  python -m tasks.sample.make_sample [--out=tasks/sample] [--nocodebook]
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import flags

from s2sjax.data import task_registry
from s2sjax.runtime import cli
from tasks.audio import mel_kmeans
from tasks.audio.base import load_audio
from tasks.importer import topic_stories
from tasks.release import OPTIONS, spoken_candidates
from tasks.sample import SAMPLE_DIR
from tasks.speech import speak

def release_lines(task: str, source: list[dict]) -> list[dict]:
  if task_registry.get(task).release_format == "story_pairs":
    # uttids: plain ints for English, "<int>_zh" strings for Chinese (both forms occur in the release)
    suffix = "_zh" if task_registry.get(task).language == "zh" else ""
    lines = []
    for k, story in enumerate(source):
      lines.append({"uttid": f"{2 * k}{suffix}" if suffix else 2 * k, "first": story["first"], "last": story["right"]})
      lines.append({"uttid": f"{2 * k + 1}{suffix}" if suffix else 2 * k + 1, "first": story["first"], "last": story["wrong"]})
    return lines
  return [{"uttid": k, "first": q["first"], **{o: q[o] for o in OPTIONS}, "answer": q["answer"]} for k, q in enumerate(source)]


def main(argv):
  del argv
  out = flags.FLAGS.out
  sources = {"sstorycloze": "en_stories.json", "zh_sstorycloze": "zh_stories.json", "scmmlu": "zh_cmmlu.json",
             "tstorycloze": "en_stories.json"}
  waves = []  # the codebook is fitted on S2SBench's three tasks (tStoryCloze repeats sStoryCloze's prefixes)
  for task, name in sources.items():
    with open(os.path.join(SAMPLE_DIR, "source", name), encoding="utf-8") as f:
      source = json.load(f)
    lines = release_lines(task, topic_stories(source) if task == "tstorycloze" else source)
    record = task_registry.get(task)
    jsonl = os.path.join(out, "release", record.release_jsonl)
    audio_dir = os.path.join(out, "release", record.release_audio_dir)
    os.makedirs(audio_dir, exist_ok=True)
    with open(jsonl, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    candidate_dir = os.path.join(out, "release", record.release_candidate_audio_dir)
    os.makedirs(candidate_dir, exist_ok=True)
    for line in lines:
      path = os.path.join(audio_dir, f"{line['uttid']}.wav")
      speak(line["first"], record.language, path)
      if task != "tstorycloze":
        waves.append(load_audio(path, mel_kmeans.SAMPLE_RATE))
      for name, text in spoken_candidates(task, line).items():
        speak(text, record.language, os.path.join(candidate_dir, f"{name}.wav"))
    print(f"{task}: {len(lines)} lines -> {jsonl}")
  if not flags.FLAGS.codebook:
    return
  features = np.concatenate([mel_kmeans.log_mel(w) for w in waves])
  codebook = mel_kmeans.fit_codebook(features, clusters=256)
  np.save(os.path.join(out, "mel_kmeans_256.npy"), codebook)
  print(f"mel k-means codebook: 256 clusters from {len(features)} frames")


if __name__ == "__main__":
  flags.DEFINE_string("out", SAMPLE_DIR, "Where to write release/ and the codebook.")
  flags.DEFINE_bool("codebook", True, "Refit the mel k-means codebook (changes every unit of the sample).")
  cli.run(main)
