"""S→T data for the paper's systems built with their own audio tokenizers, in JAX, with torch out of reach:
`tasks.prepare` reads the upstream oracles' tokenizer folders as release folders, tokenizes the bundled sample's
wavs, and the codes laid in the rows equal those the tokenizer gives the same wav (which the oracle tests hold to
the upstream code's own codes)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from s2sjax.data.spec import SPECS_DIR, load_spec
from s2sjax.data.task_data import load_task_data
from tasks.audio.base import load_audio
from tasks.release import read_questions
from tasks.sample import RELEASE_DIR

ROOT = Path(__file__).resolve().parents[1]
ORACLES = ROOT.parent / "shared" / "upstream-oracles"
needs_oracles = pytest.mark.skipif(not ORACLES.exists(), reason="../shared/upstream-oracles is absent")

# Runs a command line with torch invisible, as on a TPU VM without it: transformers sees no torch, and any
# `import torch` fails loudly.
WITHOUT_TORCH = """
import importlib.util, runpy, sys
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name.split(".")[0] == "torch" else _find_spec(name, *a, **k)
class NoTorch:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] == "torch":
      raise ModuleNotFoundError(f"{name} was imported: building data must not need torch")
sys.meta_path.insert(0, NoTorch())
module = sys.argv.pop(1)
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def run_without_torch(module: str, *args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, module, *args], cwd=str(ROOT), env=env,
                        capture_output=True, text=True, timeout=900)


def oracle_spec(tmp_path, preset: str, tokenizer) -> str:
  """The preset with the oracle's scaled codebooks (its only difference from the release: sizes)."""
  fields = yaml.safe_load(open(os.path.join(SPECS_DIR, f"{preset}.yaml")))
  fields["codebook_sizes"] = list(tokenizer.codebook_sizes)
  path = tmp_path / f"{preset}.yaml"
  path.write_text(yaml.safe_dump(fields))
  return str(path)


def text_tokenizer(tmp_path, qwen_tokenizer_dir, spec) -> str:
  """Qwen2.5's tokenizer with the spec's special tokens (and, for units in the vocabulary, one per code)."""
  from transformers import AutoTokenizer

  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  extra = [t for t in (spec.start_token, spec.end_token, spec.placeholder_token) if t]
  if spec.unit_token:
    extra += [spec.unit_token.format(k) for k in range(spec.codebook_sizes[0])]
  tokenizer.add_tokens(extra, special_tokens=True)
  tokenizer.save_pretrained(str(tmp_path / "text"))
  return str(tmp_path / "text")


def laid_codes(data, spec, tokenizer_dir) -> list[np.ndarray]:
  """Each item's audio codes as the rows carry them, in row order: codebook tables at the placeholder positions,
  units as the ids between the audio start and end tokens."""
  from transformers import AutoTokenizer

  tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
  found = []
  for r in range(data.num_rows):
    tokens, segments, branches = (data.rows[k][r] for k in ("tokens", "segment_ids", "branch_ids"))
    for segment in sorted(set(segments.tolist()) - {0}):
      prefix = (segments == segment) & (branches == 0)
      if spec.audio_mode == "codebook_tables":
        found.append(data.rows["audio_codes"][r][prefix & (data.rows["audio_codes"][r][:, 0] >= 0)])
      else:
        ids = tokens[prefix].tolist()
        start, end = (tokenizer.convert_tokens_to_ids(t) for t in (spec.start_token, spec.end_token))
        units = ids[ids.index(start) + 1: ids.index(end)]
        unit_of = {tokenizer.convert_tokens_to_ids(spec.unit_token.format(k)): k for k in range(spec.codebook_sizes[0])}
        found.append(np.array([[unit_of[u]] for u in units]))
  return found


AUDIO_LINE = re.compile(r"audio: ([\d,.]+) audio s tokenized in [\d,.]+s \([\d,.]+ audio s/s\), (\d+) recordings' "
                        r"codes reused across builds; compiled (\d+) tokenizer programs in [\d,.]+s, (\d+) loaded "
                        r"from the compilation cache \((\d+) shapes, (\w+)\)")
TOKENIZERS = {"baichuan_audio": ("baichuan_audio_tokenizer", "tasks.audio.baichuan:BaichuanAudioTokenizer"),
              "glm4_voice": ("glm4voice_tokenizer", "tasks.audio.glm4_voice:Glm4VoiceTokenizer")}


def oracle_tokenizer(preset: str):
  from s2sjax.runtime.registry import load_object

  folder, tokenizer_class = TOKENIZERS[preset]
  return load_object(tokenizer_class)(str(ORACLES / folder))


@pytest.fixture(scope="module")
def no_torch_build(build_once, qwen_tokenizer_dir):
  """`no_torch_build(preset)`: the sample's sStoryCloze S->T built by `tasks.prepare` with torch out of reach and
  the oracle's audio tokenizer of the preset, once a session (the no-torch test and the distributed one read
  GLM-4-Voice's): {spec, tokenizer_dir, audio_tokenizer_dir, data_dir, audio_seconds}."""
  def build_for(preset: str) -> dict:
    def build(root: str) -> dict:
      root = Path(root)
      root.mkdir(parents=True)
      spec_path = oracle_spec(root, preset, oracle_tokenizer(preset))
      tokenizer_dir = text_tokenizer(root, qwen_tokenizer_dir, load_spec(spec_path))
      audio_dir, data_dir = str(ORACLES / TOKENIZERS[preset][0]), str(root / "data")
      done = run_without_torch("tasks.prepare", "--task=sstorycloze", f"--spec={spec_path}", "--modality=s2t",
                               f"--tokenizer_dir={tokenizer_dir}", f"--audio_tokenizer_dir={audio_dir}",
                               f"--data_dir={data_dir}")
      assert done.returncode == 0, done.stderr[-3000:]
      return {"spec": spec_path, "tokenizer_dir": tokenizer_dir, "audio_tokenizer_dir": audio_dir,
              "data_dir": data_dir, "audio_seconds": float(AUDIO_LINE.search(done.stdout).group(1).replace(",", ""))}

    return build_once(f"{preset}-no-torch-build", build)

  return build_for


@needs_oracles
@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(TOKENIZERS))
def test_prepare_builds_s2t_rows_with_the_models_own_tokenizer_and_no_torch(no_torch_build, preset):
  built = no_torch_build(preset)
  tokenizer, spec, tokenizer_dir = oracle_tokenizer(preset), load_spec(built["spec"]), built["tokenizer_dir"]
  data = load_task_data(built["data_dir"], "sstorycloze", "s2t", built["spec"], None)
  report = data.metadata.report
  assert report["audio_seconds"] > 60 and report["audio_files_resampled"] == 0
  assert data.metadata.audio_tokenizer["type"] == preset

  questions = {q.id: q for q in read_questions("sstorycloze", RELEASE_DIR)}
  expected = {}
  for question in questions.values():  # a story's two lines carry the same prefix audio
    wave = load_audio(question.audio_paths[0], 16000)
    expected.setdefault(tokenizer.encode(wave, question.uttids[0]).tobytes(), None)
  laid = laid_codes(data, spec, tokenizer_dir)
  assert len(laid) == len(expected) == len(questions)
  assert {codes.astype(np.int64).tobytes() for codes in laid} == {
      np.frombuffer(k, np.int32).astype(np.int64).tobytes() for k in expected}


@needs_oracles
@pytest.mark.slow
def test_one_prepare_tokenizes_each_recording_once_and_a_second_compiles_nothing(tmp_path, qwen_tokenizer_dir):
  """S->T and S->S of a run share one tokenization of the spoken prefixes (the last line says how many were
  reused, and the audio seconds tokenized are the recordings' once); the same command into another data dir, on
  the same host, loads every tokenizer program from the persistent compilation cache and compiles none."""
  from tasks.audio.glm4_voice import Glm4VoiceTokenizer

  folder = ORACLES / "glm4voice_tokenizer"
  spec_path = oracle_spec(tmp_path, "glm4_voice", Glm4VoiceTokenizer(str(folder)))
  tokenizer_dir = text_tokenizer(tmp_path, qwen_tokenizer_dir, load_spec(spec_path))
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"))

  def prepare(data_dir: str) -> tuple:
    done = subprocess.run([sys.executable, "-m", "tasks.prepare", "--task=sstorycloze", f"--spec={spec_path}",
                           "--modality=s2t,s2s", f"--tokenizer_dir={tokenizer_dir}",
                           f"--audio_tokenizer_dir={folder}", f"--data_dir={data_dir}", "--shapes=windows"],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return AUDIO_LINE.search(done.stdout).groups()

  seconds, reused, compiled, loaded, shapes, policy = prepare(str(tmp_path / "first"))
  questions = read_questions("sstorycloze", RELEASE_DIR)
  prefixes = {load_audio(p, 16000).tobytes() for q in questions for p in q.audio_paths}  # a story's two share one
  recordings = prefixes | {load_audio(p, 16000).tobytes() for q in questions for p in q.candidate_audio_paths}
  assert int(reused) == len(prefixes) and policy == "windows" and int(shapes) <= 4 and int(loaded) == 0
  assert int(compiled) == int(shapes)
  # each distinct recording once: the prefixes for S->T, the endings and nothing more for S->S
  assert float(seconds.replace(",", "")) == pytest.approx(sum(len(r) for r in recordings) / 4 / 16000, abs=0.1)
  again = prepare(str(tmp_path / "second"))
  assert again[2:4] == ("0", shapes) and again[0] == seconds


def _free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


TIMINGS = ("build_seconds", "questions_per_second", "audio_seconds_per_second")


def _built(data_dir: Path, config: str) -> tuple[list[dict], dict]:
  """A build's rows (decoded) and its metadata less the timings."""
  import json

  import tensorflow_datasets as tfds

  folder = data_dir / "sstorycloze" / config / "1.1.0"
  source = tfds.builder_from_directory(str(folder)).as_data_source(split="test")
  metadata = json.loads((folder / "metadata.json").read_text())
  metadata["report"] = {k: v for k, v in metadata["report"].items() if k not in TIMINGS}
  return [source[i] for i in range(len(source))], metadata


@needs_oracles
@pytest.mark.slow
def test_a_distributed_prepare_of_two_processes_builds_what_one_does(tmp_path, no_torch_build):
  """Two processes on loopback (JAX's multi-process runtime, CPU collectives over gloo): each tokenizes half of the
  recordings (its audio line says so), process 0 alone writes, and the build holds the rows and metadata of a
  one-process build (only the timings differ; TFDS's record bytes differ between any two builds)."""
  one = no_torch_build("glm4_voice")
  command = [sys.executable, "-m", "tasks.prepare", "--task=sstorycloze", f"--spec={one['spec']}",
             "--modality=s2t", f"--tokenizer_dir={one['tokenizer_dir']}",
             f"--audio_tokenizer_dir={one['audio_tokenizer_dir']}"]
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  port = _free_port()
  processes = [subprocess.Popen(command + [f"--data_dir={tmp_path / 'two'}", "--distributed", "--cpu_collectives=gloo",
                                          f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                                          f"--process_id={k}"], cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for k in range(2)]
  try:
    outputs = [p.communicate(timeout=900) for p in processes]
  finally:
    for p in processes:
      p.kill()
  assert [p.returncode for p in processes] == [0, 0], [err[-3000:] for _, err in outputs]
  config = next(p.name for p in (Path(one["data_dir"]) / "sstorycloze").iterdir() if not p.name.startswith("."))
  assert sorted(p.name for p in (tmp_path / "two" / "sstorycloze").iterdir()) == sorted(
      p.name for p in (Path(one["data_dir"]) / "sstorycloze").iterdir())
  rows_one, metadata_one = _built(Path(one["data_dir"]), config)
  rows_two, metadata_two = _built(tmp_path / "two", config)
  assert metadata_two == metadata_one and len(rows_two) == len(rows_one)
  for a, b in zip(rows_one, rows_two):
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  tokenized = [float(AUDIO_LINE.search(out).group(1).replace(",", "")) for out, _ in outputs]
  assert sum(tokenized) == pytest.approx(one["audio_seconds"], abs=0.1) and min(tokenized) > 0.3 * one["audio_seconds"]
  assert f"{config}:" in outputs[0][0] and f"{config}:" not in outputs[1][0]  # process 0 writes and reports
