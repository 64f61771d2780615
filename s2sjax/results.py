"""Result files a person can read: per-candidate scores, metrics, the paper's Table 1 layout, curves over steps;
and the chunk store that makes an evaluation resumable after preemption.

    OUT/chunks/<checkpoint>/<task>-<modality>/chunk-00003.npz (+ .done)   rows [start, stop) of one run
    OUT/<checkpoint>/<task>-<modality>.scores.jsonl                     one line per candidate
    OUT/metrics.json, OUT/table.md, OUT/table.csv                       every checkpoint, task, modality
    OUT/curves_accuracy.png, OUT/curves_loss.png                        over training steps (several checkpoints)

A chunk is written to a temporary name, renamed, then marked done; a rerun reuses every marked chunk and scores
only the rest, so the final files equal an uninterrupted run's. Paths go through etils `epath`, so OUT may be a
`gs://` bucket (as orbax and TFDS allow for checkpoints and data).
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
from etils import epath


class ChunkStore:
  """Resumable per-row results of one (checkpoint, task, modality). `identity.json` records what produced them
  (checkpoint, dtype, chunking, a hash of the rows), so a rerun resumes only from its own chunks."""

  def __init__(self, directory, identity: dict):
    self.directory = epath.Path(directory)
    self.identity = identity

  def mismatch(self) -> str | None:
    """Why the chunks here are not this run's (None if they are, or if there are none)."""
    path = self.directory / "identity.json"
    if not path.exists():  # nothing saved yet, or chunks of a version that recorded no identity: resumed unverified
      return None
    saved = json.loads(path.read_text())
    differ = [f"{key}: {saved.get(key)!r} there, {value!r} now" for key, value in self.identity.items()
              if saved.get(key) != value]
    if not differ:
      return None
    return (f"{self.directory} holds results of another run ({'; '.join(differ)}): use another --output_dir, or "
            "delete that folder to score again")

  def _path(self, index: int) -> epath.Path:
    return self.directory / f"chunk-{index:05d}.npz"

  def _marker(self, index: int) -> epath.Path:
    return self.directory / f"chunk-{index:05d}.npz.done"

  def done(self, index: int) -> bool:
    return self._marker(index).exists()

  def save(self, index: int, nll_sum: np.ndarray, n_tokens: np.ndarray) -> None:
    self.directory.mkdir(parents=True, exist_ok=True)
    if not (self.directory / "identity.json").exists():
      (self.directory / "identity.json").write_text(json.dumps(self.identity, indent=2))
    buffer = io.BytesIO()
    np.savez(buffer, nll_sum=nll_sum, n_tokens=n_tokens)
    tmp = self.directory / f"chunk-{index:05d}.tmp"
    tmp.write_bytes(buffer.getvalue())
    tmp.rename(self._path(index))
    self._marker(index).write_text("")

  def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(self._path(index).read_bytes())) as f:
      return f["nll_sum"], f["n_tokens"]


def scores_lines(questions: list[dict], arrays: dict[str, np.ndarray]) -> list[dict]:
  lines = []
  for q, question in enumerate(questions):
    for c, text in enumerate(question["candidates"]):
      mean = float(arrays["loss"][q, c])
      lines.append({
        "question": question["id"], "uttid": question["uttids"][c], "candidate": c, "text": text,
        "correct": c == question["correct"], "nll_sum": round(float(arrays["nll_sum"][q, c]), 6),
        "n_tokens": int(arrays["n_tokens"][q, c]), "mean_nll": round(mean, 6), "ppl": round(float(np.exp(mean)), 6),
      })
  return lines


def _write_text(path, text: str) -> None:
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")


def write_jsonl(path, lines: list[dict]) -> None:
  _write_text(path, "".join(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n" for line in lines))


def write_json(path, value) -> None:
  _write_text(path, json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


TASK_TITLES = {"sstorycloze": "sStoryCloze", "zh_sstorycloze": "zh-sStoryCloze", "scmmlu": "sCMMLU"}
MODALITY_TITLES = {"text": "T→T", "speech": "S→T"}


def table_rows(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
  """Paper Table 1 layout: a row per model x modality, a column per task (accuracy, %)."""
  tasks = [t for t in TASK_TITLES if any(t in r["tasks"] for r in runs)]
  header = ["model", "modality"] + [TASK_TITLES[t] for t in tasks]
  rows = []
  for run in runs:
    for modality in ("text", "speech"):
      cells = [run["tasks"].get(t, {}).get(modality) for t in tasks]
      if any(cells):
        rows.append([run["name"], MODALITY_TITLES[modality]]
                    + [f"{100 * c['accuracy']:.1f}" if c else "-" for c in cells])
  return header, rows


def write_tables(out_dir, runs: list[dict]) -> None:
  header, rows = table_rows(runs)
  markdown = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
  _write_text(epath.Path(out_dir) / "table.md", "\n".join(markdown) + "\n")
  buffer = io.StringIO()
  csv.writer(buffer).writerows([header] + rows)
  _write_text(epath.Path(out_dir) / "table.csv", buffer.getvalue())


def plot_curves(out_dir, history: list[dict]) -> list[epath.Path]:
  """Accuracy and positive/negative loss over steps, one line per task x modality (paper Appendix A)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  points = [h for h in history if h.get("step") is not None]
  if len(points) < 2:
    return []
  points.sort(key=lambda h: h["step"])
  steps = [h["step"] for h in points]
  series = sorted({(t, m) for h in points for t, v in h["tasks"].items() for m in v})
  paths = []
  for name, keys in (("accuracy", ["accuracy"]), ("loss", ["positive_loss", "negative_loss"])):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for task, modality in series:
      for key in keys:
        ys = [h["tasks"].get(task, {}).get(modality, {}).get(key, np.nan) for h in points]
        style = "--" if key == "negative_loss" else "-"
        label = f"{TASK_TITLES[task]} {MODALITY_TITLES[modality]}" + (f" {key.split('_')[0]}" if len(keys) > 1 else "")
        ax.plot(steps, [100 * y if name == "accuracy" else y for y in ys], style, marker="o", label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("accuracy (%)" if name == "accuracy" else "mean NLL (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = epath.Path(out_dir) / f"curves_{name}.png"
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    path.write_bytes(image.getvalue())
    paths.append(path)
  return paths


SCALARS = ("accuracy", "positive_loss", "negative_loss", "loss_gap")


def write_tensorboard(out_dir, run: dict, step: int) -> None:
  """The run's headline numbers as TensorBoard scalars (`<task>/<modality>/<metric>`, `<task>/degradation`), via
  tensorboardX (the `tensorboard` extra), so no TensorFlow is needed."""
  from tensorboardX import SummaryWriter

  with SummaryWriter(str(epath.Path(out_dir) / "tensorboard")) as writer:
    for task, modalities in run["tasks"].items():
      for modality, values in modalities.items():
        for key in SCALARS:
          writer.add_scalar(f"{task}/{modality}/{key}", values[key], step)
    for task, report in run["degradation"].items():
      writer.add_scalar(f"{task}/degradation", report["degradation"], step)
