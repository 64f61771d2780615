"""Result files a person can read: per-candidate scores, metrics, the paper's Table 1 layout, curves over steps,
TensorBoard scalars.

    OUT/<checkpoint>/run.json                                           the checkpoint's name, path, step, spec
    OUT/<checkpoint>/<task>-<modality>.scores.jsonl                     one line per candidate (modality: t2t,
                                                                        s2t, t2s, s2s, s2s_utterance)
    OUT/<checkpoint>/<task>-<modality>.details.jsonl                    one line per candidate: the further
                                                                        numbers its architecture gives (MiMo-Audio,
                                                                        Step-Audio 2: spoken candidates)
    OUT/<checkpoint>/<task>-<modality>.pairs.jsonl                      one line per pair of whole recordings, in
                                                                        SlamKit's terms (s2sjax/results/pair_items.py)
    OUT/metrics.json, OUT/table.md, OUT/table.csv                       every checkpoint, task, modality; the
                                                                        degradation matrix (metrics.json, table.md)
    OUT/curves_accuracy.png, OUT/curves_loss.png                        over training steps (several checkpoints;
                                                                        a line per run: the checkpoints' folder)

The summaries (metrics.json, the tables, the curves) are recomputed from every completed scores file in OUT
(`read_runs`), so a later run of another task, modality or checkpoint adds to them and never drops what is there.
A scores file is written from the chunks, and its line count and hash are recorded beside them
(`chunks/<checkpoint>/<task>-<modality>/scores.json`); before the summaries are recomputed each file is held to
that record, and one that differs (lines lost, edited) is rewritten from its chunks, with a line saying so.
Every file is written whole or not at all (`output_dir.write_atomic`), as strict JSON (no NaN). Paths go through
etils `epath`, so OUT may be a `gs://` bucket.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import sys

import numpy as np
from etils import epath

from s2sjax.data import task_registry, modalities
from s2sjax.scoring.checkpoints import paths as checkpoint_paths
from s2sjax.results.chunk_store import SCORES_RECORD, ChunkStore, scores_from_chunks
from s2sjax.results.pair_items import PAIRS_SUFFIX, pair_lines
from s2sjax.data.metrics import candidate_loss, summarize
from s2sjax.runtime.output_dir import DamagedFileError, read_json, strict_json, write_atomic
from s2sjax.data.question_details import QuestionDetails
from s2sjax.data.questions import QuestionScores

RUN_RECORD = "run.json"
SCORES_SUFFIX = ".scores.jsonl"
DETAILS_SUFFIX = ".details.jsonl"


def _write_text(path, text: str) -> None:
  write_atomic(path, text.encode("utf-8"))


def chunk_dir(out_dir, run_folder: str, task: str, modality: str) -> epath.Path:
  """Where the chunks of one checkpoint's task x modality lie (s2sjax/results/chunk_store.py)."""
  return epath.Path(out_dir) / "chunks" / run_folder / f"{task}-{modality}"


def write_run(run_dir, record: dict, scores: dict[tuple[str, str], QuestionScores],
              stores: dict[tuple[str, str], ChunkStore] | None = None,
              details: dict[tuple[str, str], QuestionDetails] | None = None) -> None:
  """One checkpoint's files: its record and a scores file per task x modality scored now; the line count and hash
  of each are recorded in its chunk store (`stores`), which `read_runs` holds the file to. A task of pairs of whole
  recordings (its release format's `pair_items`) gets its pairs file beside; a details file beside the scores of
  each task x modality in `details` (the architecture's further numbers per candidate)."""
  write_json(epath.Path(run_dir) / RUN_RECORD, record)
  for key, s in scores.items():
    _write_scores(epath.Path(run_dir) / f"{key[0]}-{key[1]}{SCORES_SUFFIX}", s, (stores or {}).get(key))
    record = task_registry.get(key[0])
    if record.release.pair_items:
      _write_pairs(epath.Path(run_dir) / f"{key[0]}-{key[1]}{PAIRS_SUFFIX}", pair_lines(s, candidate_loss(record, s)))
  for key, d in (details or {}).items():
    path = epath.Path(run_dir) / f"{key[0]}-{key[1]}{DETAILS_SUFFIX}"
    write_atomic(path, _jsonl(d.to_lines(), path))


def _jsonl(lines: list[dict], path) -> bytes:
  return "".join(strict_json(line, str(path), ensure_ascii=False, sort_keys=True) + "\n" for line in lines).encode()


def _write_scores(path: epath.Path, scores: QuestionScores, store: ChunkStore | None) -> None:
  lines = scores.to_lines()
  data = _jsonl(lines, path)
  write_atomic(path, data)
  if store is not None:
    store.write_scores_record(len(lines), hashlib.sha256(data).hexdigest())


def _write_pairs(path: epath.Path, lines: list[dict]) -> None:
  _write_text(path, "".join(strict_json(line, str(path), ensure_ascii=False) + "\n" for line in lines))


def _read_scores(path: epath.Path) -> QuestionScores:
  """A scores file as it stands; a line that is not JSON, or questions that are not whole, name the file."""
  lines = []
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    if not line:
      continue
    try:
      lines.append(json.loads(line))
    except ValueError as e:
      raise DamagedFileError(f"{path}:{number} is not JSON ({e}): the file is damaged; rerun the evaluation of that "
                             "task and modality into this directory to score it again") from None
  return QuestionScores.from_lines(lines, where=str(path))


def _checked_scores(out_dir, run_folder: str, path: epath.Path, task: str, modality: str) -> QuestionScores:
  """A scores file held to the record written with it: intact, it is read; damaged or gone (lines lost, edited),
  it is rewritten from its chunks, with a line saying so. Files of versions that kept no record are read as they
  are."""
  store = ChunkStore(chunk_dir(out_dir, run_folder, task, modality), {})
  record = store.scores_record()
  data = path.read_bytes() if path.exists() else None
  if record is None:
    return _read_scores(path)
  if data is not None and hashlib.sha256(data).hexdigest() == record.get("sha256"):
    return _read_scores(path)
  lines = None if data is None else data.count(b"\n")
  found = ("missing" if data is None else f"{lines} of the {record.get('lines')} lines written"
           if lines != record.get("lines") else "edited: its hash differs from the one written")
  try:
    scores = scores_from_chunks(store)
  except ValueError as e:
    raise DamagedFileError(f"{path} is damaged ({found}) and its chunks cannot rebuild it ({e}): rerun that task and "
                           f"modality ({task}, {modality}) into {out_dir} to score it again") from None
  _write_scores(path, scores, store)
  print(f"{path}: damaged ({found}): rewritten from its chunks ({len(scores)} questions)", file=sys.stderr,
        flush=True)
  return scores


def read_runs(out_dir) -> list[dict]:
  """Every checkpoint with completed scores in OUT, in step order: its record, and the metrics and degradation
  reports of everything it has scored (what metrics.json holds), each scores file checked against its chunks
  first."""
  runs = []
  for record_path in sorted(epath.Path(out_dir).glob(f"*/{RUN_RECORD}")):
    record = read_json(record_path, "a checkpoint's run record", "rerun the evaluation into this directory")
    folder = record_path.parent.name
    names = {path.name[: -len(SCORES_SUFFIX)] for path in record_path.parent.glob(f"*{SCORES_SUFFIX}")}
    chunks = epath.Path(out_dir) / "chunks" / folder
    if chunks.exists():  # a scores file deleted since: its chunks' record names it
      names |= {p.parent.name for p in chunks.glob(f"*/{SCORES_RECORD}")}
    scores = {}
    for name in sorted(names):
      task, _, modality = name.rpartition("-")
      path = record_path.parent / f"{name}{SCORES_SUFFIX}"
      checked = _checked_scores(out_dir, folder, path, task, modality)
      scores[(task, modalities.Label.from_key(modality))] = checked
    summary = summarize(scores, record.get("ties"))
    runs.append({**record, "tasks": {k: v for k, v in summary.items() if k != "degradation"},
                 "degradation": summary.get("degradation", {})})
  return sorted(runs, key=lambda r: (r["step"] is None, r["step"] or 0, r["name"]))


def write_summaries(out_dir, runs: list[dict]) -> None:
  """metrics.json, the Table 1 files and the curves."""
  write_json(epath.Path(out_dir) / "metrics.json", {"runs": runs})
  write_tables(out_dir, runs)
  plot_curves(out_dir, runs)


def write_json(path, value) -> None:
  _write_text(path, strict_json(value, str(path), indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def table_rows(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
  """Paper Table 1 layout: a row per model x modality, a column per task (accuracy, %)."""
  tasks = [t for t in task_registry.names() if any(t in r["tasks"] for r in runs)]
  header = ["model", "modality"] + [task_registry.get(t).title for t in tasks]
  rows = []
  for run in runs:
    for modality in sorted({m for t in run["tasks"].values() for m in t}, key=modalities.order):
      cells = [run["tasks"].get(t, {}).get(modality) for t in tasks]
      rows.append([run["name"], modalities.title(modality)]
                  + [f"{100 * c['accuracy']:.1f}" if c else "-" for c in cells])
  return header, rows


def degradation_rows(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
  """The degradation matrix: a row per model x pair of modalities, a column per task (points of accuracy lost,
  with the 95% interval)."""
  tasks = [t for t in task_registry.names() if any(t in r["degradation"] for r in runs)]
  header = ["model", "degradation"] + [task_registry.get(t).title for t in tasks]
  rows = []
  for run in runs:
    keys = dict.fromkeys(key for t in tasks for key in run["degradation"].get(t, {}))
    for key in sorted(keys, key=_comparison_order):
      other, reference = key.split("_vs_")
      cells = [run["degradation"].get(t, {}).get(key) for t in tasks]
      if any(cells):
        rows.append([run["name"], f"{modalities.title(reference)} − {modalities.title(other)}"] + [
          f"{100 * c['degradation']:+.1f} [{100 * c['degradation_ci95'][0]:+.1f}, {100 * c['degradation_ci95'][1]:+.1f}]"
          if c else "-" for c in cells])
  return header, rows


def _comparison_order(key: str) -> tuple:
  """A degradation key's place: its pair's in modalities.COMPARISONS, then its labels' protocols."""
  other, reference = (modalities.Label.from_key(label) for label in key.split("_vs_"))
  return modalities.COMPARISONS.index((reference.modality.name, other.modality.name)), reference.order, other.order


def breakdown_tables(runs: list[dict]) -> list[tuple[str, list[str], list[list[str]]]]:
  """A table per task x label its record breaks the accuracy down by (a frequency band, a type): a row per model x
  modality, a column per label value in the order metrics.json holds them (accuracy, %, and the count)."""
  tables = []
  for task in task_registry.names():
    for label in task_registry.get(task).breakdowns:
      cells = [(run["name"], modality, m[f"by_{label}"]) for run in runs
               for modality, m in sorted(run["tasks"].get(task, {}).items(), key=lambda kv: modalities.order(kv[0]))
               if f"by_{label}" in m]
      if cells:
        values = list(dict.fromkeys(value for _, _, by in cells for value in by))
        rows = [[name, modalities.title(modality)] + [
          f"{100 * by[v]['accuracy']:.1f} ({by[v]['n']})" if v in by else "-" for v in values]
                for name, modality, by in cells]
        tables.append((f"{task_registry.get(task).title} by {label} (accuracy %, count):", ["model", "modality"]
                       + values, rows))
  return tables


def write_tables(out_dir, runs: list[dict]) -> None:
  """table.md: Table 1 (accuracy, %), the degradation matrix, then each task's breakdowns; table.csv: Table 1."""
  header, rows = table_rows(runs)
  as_markdown = lambda head, body: (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                                    + ["| " + " | ".join(r) + " |" for r in body])
  markdown = as_markdown(header, rows)
  matrix_header, matrix_rows = degradation_rows(runs)
  if matrix_rows:
    markdown += ["", "Degradation (points of accuracy, 95% paired interval):", ""]
    markdown += as_markdown(matrix_header, matrix_rows)
  for title, head, body in breakdown_tables(runs):
    markdown += ["", title, ""] + as_markdown(head, body)
  _write_text(epath.Path(out_dir) / "table.md", "\n".join(markdown) + "\n")
  buffer = io.StringIO()
  csv.writer(buffer).writerows([header] + rows)
  _write_text(epath.Path(out_dir) / "table.csv", buffer.getvalue())


@dataclasses.dataclass(frozen=True)
class Line:
  label: str
  steps: list[int]
  values: list[float]
  style: str  # matplotlib's: "-" solid, "--" dashed


def curve_lines(history: list[dict]) -> dict[str, list[Line]]:
  """The lines of each figure (`accuracy`, `loss`): one per run x task x modality (x positive / negative loss),
  through its checkpoints in step order. A run is the folder its checkpoints lie in (`checkpoint_paths.run_folder`):
  `ckpts/*/step_*` over runA and runB draws each run's own curve, named by its folder, as a person comparing two
  runs reads them; one line through both would jump between them at every step they share."""
  points = sorted((h for h in history if h.get("step") is not None), key=lambda h: h["step"])
  run_of = lambda h: checkpoint_paths.run_folder(h["path"]) if h.get("path") else ""  # a training loop's: one run
  folders = sorted({run_of(h) for h in points})
  run_label = dict(zip(folders, checkpoint_paths.run_names(folders) if len(folders) > 1 else [""] * len(folders)))
  series = sorted({(t, m) for h in points for t, v in h["tasks"].items() for m in v})
  figures = {}
  for name, keys in (("accuracy", ["accuracy"]), ("loss", ["positive_loss", "negative_loss"])):
    figures[name] = []
    for folder in folders:
      run = [h for h in points if run_of(h) == folder]
      for task, modality in series:
        for key in keys:
          values = [h["tasks"].get(task, {}).get(modality, {}).get(key, np.nan) for h in run]
          label = " ".join(filter(None, (run_label[folder], task_registry.get(task).title, modalities.title(modality),
                                         key.split("_")[0] if len(keys) > 1 else "")))
          figures[name].append(Line(label, [h["step"] for h in run],
                                    [100 * v if name == "accuracy" else v for v in values],
                                    "--" if key == "negative_loss" else "-"))
  return figures


def plot_curves(out_dir, history: list[dict]) -> list[epath.Path]:
  """Accuracy and positive/negative loss over steps, one line per run x task x modality (paper Appendix A)."""
  if sum(h.get("step") is not None for h in history) < 2:  # before importing matplotlib: an interrupted run
    return []                                                # writes its summaries within seconds
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  paths = []
  for name, lines in curve_lines(history).items():
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for line in lines:
      ax.plot(line.steps, line.values, line.style, marker="o", label=line.label)
    ax.set_xlabel("training step")
    ax.set_ylabel("accuracy (%)" if name == "accuracy" else "mean NLL (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = epath.Path(out_dir) / f"curves_{name}.png"
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, image.getvalue())
    paths.append(path)
  return paths


SCALARS = ("accuracy", "positive_loss", "negative_loss", "loss_gap")


def scalars(tasks: dict, degradation: dict) -> dict[str, float]:
  """The headline numbers of one evaluation by their scalar names, `<task>/<modality>/<metric>` and
  `<task>/degradation/<pair>`: what TensorBoard and a training stack's tracker are given (a run record's `tasks`
  and `degradation`, or `Evaluator.evaluate`'s result and its "degradation")."""
  found = {f"{task}/{modality}/{key}": float(values[key]) for task, by_modality in tasks.items()
           for modality, values in by_modality.items() for key in SCALARS}
  found.update({f"{task}/degradation/{pair}": float(report["degradation"]) for task, matrix in degradation.items()
                for pair, report in matrix.items()})
  return found


def write_tensorboard(out_dir, run: dict, step: int) -> None:
  """The run's headline numbers as TensorBoard scalars (`scalars`), via tensorboardX (the `tensorboard` extra), so
  no TensorFlow is needed."""
  from tensorboardX import SummaryWriter

  with SummaryWriter(str(epath.Path(out_dir) / "tensorboard")) as writer:
    for name, value in scalars(run["tasks"], run["degradation"]).items():
      writer.add_scalar(name, value, step)
