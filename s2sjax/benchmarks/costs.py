r"""How the cost of a run grows: wall time and peak memory of the build (`tasks.prepare`) and of the scoring
(`s2sjax.eval`) against the number of questions and against the row length, and the planner's line for larger models
on a TPU slice beside them.

  python -m s2sjax.benchmarks.costs --storycloze_csv=CSV --cmmlu_dir=CMMLU/data/test --output=FOLDER \
      [--stories=100,250,500,1000,1871] [--cmmlu=100,1000,4000,all] [--row_lengths=512,1024,2048,4096,8192] \
      [--planned=qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b] [--topology=v5e-8]

Every point is a fresh pair of processes, as a user runs them: the text replica of the first N questions
(`tasks.importer --nospeech --limit=N`), its T->T build at the row length, then its scoring by the embedded
default model (SmolLM2-135M, converted once beforehand), each with an empty XLA compilation cache, so a point's
wall time holds the start, the load, the compiles and the steps. Peak memory is the process's own maximum resident
set (Linux's VmHWM, read while it runs). The curves are fitted by a line (fixed cost + cost per question); where a point departs from it
by more than a tenth, the knee is named: the point where the cost per question changes most. Written to FOLDER:
costs.json, README.md (the tables) and costs.png. A benchmark, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from s2sjax.runtime import cli
from s2sjax.scoring import planner
from s2sjax.benchmarks.machine import cpu_machine, machine_line
from s2sjax.commands.default_checkpoint import default_checkpoint

FLAGS = flags.FLAGS

# Where a point leaves the fitted line by more than this share of its value, the curve is not a line.
LINEAR_TOLERANCE = 0.10
POLL_S = 0.05


def peak_resident_bytes(pid: int) -> int:
  """The process's peak resident memory since its exec (Linux's VmHWM); 0 once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), 0)
  except OSError:
    return 0


def timed_process(command: list[str], log_path: str, env: dict | None = None) -> dict:
  """Runs `command` to its end, output to `log_path`: its wall seconds and its own peak resident memory. The peak
  is read from /proc while it runs (every POLL_S): the rusage a parent gets counts the memory of the process it was
  forked from too."""
  start = time.time()
  peak = 0
  with open(log_path, "w") as log:
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    while process.poll() is None:
      peak = max(peak, peak_resident_bytes(process.pid))
      time.sleep(POLL_S)
  seconds = time.time() - start
  if process.returncode:
    with open(log_path) as log:
      tail = "".join(log.readlines()[-15:])
    raise RuntimeError(f"{' '.join(command[:3])} ... exited {process.returncode} (log {log_path}):\n{tail}")
  return dict(seconds=round(seconds, 2), peak_rss_gib=round(peak / 2**30, 3))


def linear_fit(xs, ys) -> dict:
  """The least-squares line y = fixed + per_unit * x, its R^2, each point's departure from it as a share of the
  point, and — where one departs by more than LINEAR_TOLERANCE — the knee: the x after which the cost per unit
  (the slope between neighbouring points) changes by the largest factor."""
  xs, ys = np.asarray(xs, float), np.asarray(ys, float)
  per_unit, fixed = np.polyfit(xs, ys, 1)
  fitted = fixed + per_unit * xs
  total = ((ys - ys.mean()) ** 2).sum()
  r2 = 1.0 - ((ys - fitted) ** 2).sum() / total if total > 0 else 1.0
  departure = np.abs(ys - fitted) / np.maximum(np.abs(ys), 1e-12)
  out = dict(fixed=float(fixed), per_unit=float(per_unit), r2=float(r2),
             largest_departure=float(departure.max()), linear=bool(departure.max() <= LINEAR_TOLERANCE), knee=None)
  if not out["linear"] and len(xs) >= 3:
    slopes = np.diff(ys) / np.diff(xs)
    change = np.abs(np.log(np.maximum(np.abs(slopes[1:]), 1e-12) / np.maximum(np.abs(slopes[:-1]), 1e-12)))
    at = int(np.argmax(change)) + 1
    out["knee"] = dict(x=float(xs[at]), slope_before=float(slopes[at - 1]), slope_after=float(slopes[at]))
  return out


class Runner:
  """One work folder; a point's replica, build and scoring each in its own process."""

  def __init__(self, folder: str, storycloze_csv: str, cmmlu_dir: str):
    self.folder, self.storycloze_csv, self.cmmlu_dir = folder, storycloze_csv, cmmlu_dir
    self.releases: dict[int | None, str] = {}

  def release(self, limit: int | None) -> str:
    """The text replica of the first `limit` questions of each task (all: None)."""
    if limit not in self.releases:
      out = os.path.join(self.folder, f"release-{limit or 'all'}")
      command = [sys.executable, "-m", "tasks.importer", f"--storycloze_csv={self.storycloze_csv}",
                 f"--cmmlu_dir={self.cmmlu_dir}", "--nospeech", f"--output={out}"]
      timed_process(command + ([f"--limit={limit}"] if limit else []), out + ".log")
      self.releases[limit] = out
    return self.releases[limit]

  def point(self, task: str, limit: int | None, row_length: int) -> dict:
    """Build and score `task` T->T over the first `limit` questions at `row_length`; each process's figures."""
    name = f"{task}-{limit or 'all'}-{row_length}"
    data, out = (os.path.join(self.folder, f"{part}-{name}") for part in ("data", "out"))
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(self.folder, f"xla-{name}"))
    common = [f"--task={task}", "--modality=t2t", f"--data_dir={data}", f"--row_length={row_length}"]
    build = timed_process([sys.executable, "-m", "tasks.prepare", *common, f"--manual_dir={self.release(limit)}"],
                          os.path.join(self.folder, f"build-{name}.log"), env)
    score = timed_process([sys.executable, "-m", "s2sjax.eval", *common, f"--output_dir={out}"],
                          os.path.join(self.folder, f"score-{name}.log"), env)
    with open(os.path.join(out, "metrics.json")) as f:
      questions = json.load(f)["runs"][0]["tasks"][task]["t2t"]["questions"]
    point = dict(task=task, questions=questions, row_length=row_length, build=build, score=score)
    print(f"{task} {questions} questions, rows of {row_length}: build {build['seconds']:.1f} s "
          f"{build['peak_rss_gib']:.2f} GiB, score {score['seconds']:.1f} s {score['peak_rss_gib']:.2f} GiB", flush=True)
    return point


def planned_line(names: list[str], topology: str) -> list[dict]:
  """The planner's memory per chip and whole-benchmark minutes for each named model (bf16, rows of 2,048, 8 rows a
  step, 40% MFU: `s2sjax.plan`'s defaults)."""
  models = planner.named_models()
  out = []
  for name in names:
    config = models[name]
    p = planner.plan(config, topology, 2048, 8, "bfloat16", 12.5, 0.4)
    out.append(dict(model=name, params_billion=config.num_params() / 1e9, gib_per_chip=p["total_gib"],
                    minutes=p["total_seconds"] / 60, mesh=p["mesh"]))
  return out


def fits_of(points: list[dict], x: str) -> dict:
  xs = [p[x] for p in points]
  return {f"{stage}_{measure}": linear_fit(xs, [p[stage][measure] for p in points])
          for stage in ("build", "score") for measure in ("seconds", "peak_rss_gib")}


def describe(fit: dict, unit: str, per: float, measure: str) -> str:
  line = (f"{fit['fixed']:.2f} {measure} + {fit['per_unit'] * per:.3g} per {per:g} {unit} "
          f"(R² {fit['r2']:.3f}, largest departure {fit['largest_departure']:.0%})")
  if fit["linear"]:
    return "linear: " + line
  knee = fit["knee"]
  return (f"not a line ({line}); knee at {knee['x']:g} {unit}: {knee['slope_before'] * per:.3g} → "
          f"{knee['slope_after'] * per:.3g} per {per:g} {unit}")


def markdown(run: dict) -> str:
  lines = [f"Cost curves, {machine_line(run['machine'])}; load average before/after: {run['load_before']} / "
           f"{run['load_after']}", ""]
  for title, key, x, unit, per in (("questions", "by_questions", "questions", "questions", 1000),
                                   ("row length", "by_row_length", "row_length", "tokens of row", 1000)):
    lines += [f"### Against {title}", "", "| task | questions | row length | build s | build GiB | score s | score GiB |",
              "|---|---|---|---|---|---|---|"]
    for task, points in run[key].items():
      for p in points:
        lines.append(f"| {task} | {p['questions']:,} | {p['row_length']:,} | {p['build']['seconds']:.1f} | "
                     f"{p['build']['peak_rss_gib']:.2f} | {p['score']['seconds']:.1f} | {p['score']['peak_rss_gib']:.2f} |")
    lines.append("")
    for task, fits in run[f"{key}_fits"].items():
      for name, fit in fits.items():
        measure = "s" if name.endswith("seconds") else "GiB"
        lines.append(f"- {task} {name.replace('_', ' ')}: {describe(fit, unit, per, measure)}")
    lines.append("")
  lines += [f"### The planner's line on {run['topology']} (bf16, rows of 2,048, 8 rows a step, 40% MFU)", "",
            "| model | parameters | mesh | GiB per chip | whole benchmark, min |", "|---|---|---|---|---|"]
  lines += [f"| {p['model']} | {p['params_billion']:.2f} B | {p['mesh']} | {p['gib_per_chip']:.2f} | {p['minutes']:.1f} |"
            for p in run["planned"]]
  return "\n".join(lines) + "\n"


def picture(run: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for (key, x, label), axis in zip((("by_questions", "questions", "questions"),
                                    ("by_row_length", "row_length", "row length (tokens)")), axes[:2]):
    memory = axis.twinx()
    for task, points in run[key].items():
      xs = [p[x] for p in points]
      for stage, style in (("build", "--"), ("score", "-")):
        axis.plot(xs, [p[stage]["seconds"] for p in points], style + "o", label=f"{task} {stage} s")
        memory.plot(xs, [p[stage]["peak_rss_gib"] for p in points], style + "x", alpha=0.5,
                    label=f"{task} {stage} GiB")
    axis.set_xlabel(label)
    axis.set_ylabel("wall seconds (o)")
    memory.set_ylabel("peak resident GiB (x)")
    if key == "by_row_length":
      axis.set_xscale("log", base=2)
    axis.legend(fontsize=7, loc="upper left")
    memory.legend(fontsize=7, loc="lower right")
  planned = run["planned"]
  axis = axes[2]
  axis.plot([p["params_billion"] for p in planned], [p["minutes"] for p in planned], "-o", label="whole benchmark, min")
  memory = axis.twinx()
  memory.plot([p["params_billion"] for p in planned], [p["gib_per_chip"] for p in planned], "--x", color="C1",
              label="GiB per chip")
  axis.set_xlabel("parameters (billions)")
  axis.set_ylabel("minutes (o)")
  memory.set_ylabel("GiB per chip (x)")
  axis.set_title(f"planner, {run['topology']}")
  axis.legend(fontsize=7, loc="upper left")
  memory.legend(fontsize=7, loc="lower right")
  figure.suptitle(f"s2sjax cost curves, T→T, SmolLM2-135M on {run['machine'].get('processor', 'a CPU')}", fontsize=10)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def counts(values: list[str]) -> list[int | None]:
  return [None if v == "all" else int(v) for v in values]


def main(argv) -> None:
  del argv
  os.makedirs(FLAGS.output, exist_ok=True)
  default_checkpoint()  # converted once here, so no point's time holds it
  run = dict(machine=cpu_machine("float32"), topology=FLAGS.topology, load_before=os.getloadavg()[0],
             by_questions={}, by_row_length={})
  with tempfile.TemporaryDirectory(dir=FLAGS.work_dir) as folder:
    runner = Runner(folder, FLAGS.storycloze_csv, FLAGS.cmmlu_dir)
    for task, limits in (("sstorycloze", counts(FLAGS.stories)), ("scmmlu", counts(FLAGS.cmmlu))):
      run["by_questions"][task] = [runner.point(task, limit, FLAGS.row_length) for limit in limits]
    run["by_row_length"]["sstorycloze"] = [runner.point("sstorycloze", None, length)
                                           for length in map(int, FLAGS.row_lengths)]
  run["by_questions_fits"] = {task: fits_of(points, "questions") for task, points in run["by_questions"].items()}
  run["by_row_length_fits"] = {task: fits_of(points, "row_length") for task, points in run["by_row_length"].items()}
  run["planned"] = planned_line(FLAGS.planned, FLAGS.topology)
  run["load_after"] = os.getloadavg()[0]
  with open(os.path.join(FLAGS.output, "costs.json"), "w") as f:
    json.dump(run, f, indent=2)
  table = markdown(run)
  with open(os.path.join(FLAGS.output, "README.md"), "w") as f:
    f.write(table)
  picture(run, os.path.join(FLAGS.output, "costs.png"))
  print(table)


if __name__ == "__main__":
  flags.DEFINE_string("storycloze_csv", None, "StoryCloze Spring 2016 test CSV.", required=True)
  flags.DEFINE_string("cmmlu_dir", None, "CMMLU data/test directory (67 subject CSVs).", required=True)
  flags.DEFINE_string("output", None, "Folder for costs.json, README.md and costs.png.", required=True)
  flags.DEFINE_list("stories", ["100", "250", "500", "1000", "1871"], "StoryCloze question counts ('all': every one).")
  flags.DEFINE_list("cmmlu", ["100", "1000", "4000", "all"], "CMMLU question counts ('all': every one kept).")
  flags.DEFINE_list("row_lengths", ["512", "1024", "2048", "4096", "8192"], "Row lengths for all of StoryCloze.")
  flags.DEFINE_integer("row_length", 1024, "Row length of the points against questions.")
  flags.DEFINE_list("planned", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"], "Named models of s2sjax.plan.")
  flags.DEFINE_enum("topology", "v5e-8", list(planner.TOPOLOGIES), "The planner's TPU slice or GPU host.")
  flags.DEFINE_string("work_dir", None, "Where the replicas and builds go while it runs (default: the temp folder).")
  cli.run(main, __doc__)
