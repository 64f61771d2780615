r"""What XLA's persistent compilation cache saves the main job (the README's first command).

  python -m s2sjax.examples.compilation_cache [--runs=3] [--output=compilation_cache.json]

Runs `python -m s2sjax.eval --task=sstorycloze --modality=speech` once to convert the default model and build its
data (if `$S2SJAX_CACHE` does not hold them yet), then `--runs` times with an empty compilation cache and as many
times with a warm one, alternating, and prints the medians of each: the seconds XLA spent compiling (jax's own
count, `JAX_LOG_COMPILES`), the scoring time (the result line's: loading the model, compiling and running the
steps) and the wall time. The runs differ in the compilation cache only (`JAX_COMPILATION_CACHE_DIR`, which
`s2sjax.runtime.cache` leaves alone when set). On a CPU shared with other work the wall and scoring times move with the
load far more than the cache moves them; the compile seconds say what the cache saves. A benchmark, not a test: it
prints figures.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from s2sjax.runtime import cli

MAIN_JOB = ["-m", "s2sjax.eval", "--task=sstorycloze", "--modality=speech"]
RESULT_SECONDS = re.compile(r"S→T: accuracy .* \((\d+(?:\.\d+)?)s\)$", re.M)  # the result line's own timing
COMPILED = re.compile(r"Finished XLA compilation of \S+ in ([\d.e-]+) sec")  # jax's line for each compilation
CACHE_HIT = "Persistent compilation cache hit"
KEYS = ("compile_s", "scoring_s", "wall_s")


def run_main_job(xla_dir: str, output_dir: str) -> dict:
  """One run of the main job compiling into (and loading from) `xla_dir`: its seconds of compiling, scoring and
  wall time, and how many compiled programs it loaded from the cache."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=xla_dir, JAX_LOG_COMPILES="1")
  start = time.monotonic()
  done = subprocess.run([sys.executable, *MAIN_JOB, f"--output_dir={output_dir}"], capture_output=True, text=True,
                        env=env)
  wall = time.monotonic() - start
  if done.returncode != 0:
    raise RuntimeError(f"the main job failed ({done.returncode}):\n{done.stderr[-3000:]}")
  return {"compile_s": round(sum(float(s) for s in COMPILED.findall(done.stderr)), 2),
          "scoring_s": float(RESULT_SECONDS.search(done.stdout).group(1)), "wall_s": round(wall, 1),
          "cache_hits": done.stderr.count(CACHE_HIT)}


def measure(runs: int) -> dict:
  with tempfile.TemporaryDirectory(prefix="s2sjax-compilation-cache-") as scratch:
    warm_dir = os.path.join(scratch, "warm")
    first = run_main_job(warm_dir, os.path.join(scratch, "first"))  # converts and builds if need be; fills warm_dir
    cold, warm = [], []
    for i in range(runs):
      cold.append(run_main_job(os.path.join(scratch, f"cold-{i}"), os.path.join(scratch, f"out-cold-{i}")))
      warm.append(run_main_job(warm_dir, os.path.join(scratch, f"out-warm-{i}")))
      print(f"run {i + 1}: empty cache {cold[-1]}, warm cache {warm[-1]}", flush=True)
  median = lambda rows, key: statistics.median(row[key] for row in rows)
  return {"first": first, "cold": cold, "warm": warm,
          "median_cold": {key: median(cold, key) for key in KEYS},
          "median_warm": {key: median(warm, key) for key in KEYS},
          "cpus": os.cpu_count(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d")}


def main(argv):
  del argv
  result = measure(flags.FLAGS.runs)
  cold, warm = result["median_cold"], result["median_warm"]
  print(f"the compilation cache saves the main job {cold['compile_s'] - warm['compile_s']:.1f} s of compiling "
        f"({cold['compile_s']:.1f} s -> {warm['compile_s']:.1f} s); scoring {cold['scoring_s']:.1f} s -> "
        f"{warm['scoring_s']:.1f} s, wall {cold['wall_s']:.1f} s -> {warm['wall_s']:.1f} s (medians of "
        f"{flags.FLAGS.runs} runs each)")
  if flags.FLAGS.output:
    with open(flags.FLAGS.output, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  flags.DEFINE_integer("runs", 3, "Runs with an empty cache, and as many with a warm one.", lower_bound=1)
  flags.DEFINE_string("output", None, "Also write every run's figures here (JSON).")
  cli.run(main)
