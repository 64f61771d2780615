"""One process of a multi-process scoring run on loopback (CPU collectives over gloo); used by test_multihost.

  python tests/multihost_worker.py PORT NUM_PROCESSES PROCESS_ID DEVICES OUT.npy [--mismatch] [--mesh=SPEC]
"""

import os
import sys

port, num_processes, process_id, devices, out = sys.argv[1:6]
mismatch = "--mismatch" in sys.argv
mesh = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--mesh=")), "data:-1,model:2")
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if int(num_processes) > 1:
  jax.distributed.initialize(f"127.0.0.1:{port}", int(num_processes), int(process_id))

from s2sjax.runtime import sharding  # noqa: E402
from s2sjax.model.config import ModelConfig  # noqa: E402
from s2sjax.model.decoder import init_params  # noqa: E402
from s2sjax.data.packing import RowShape, pack  # noqa: E402
from s2sjax.scoring.scorer import Scorer, collect  # noqa: E402
from tests.scoring_cases import random_items  # noqa: E402

CONFIG = ModelConfig(
  family="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
  num_kv_heads=2, head_dim=16, rope_theta=10000.0, rotary_dim=16, rope_interleaved=False, rms_norm_eps=1e-6,
  qkv_bias=True, o_bias=False, mlp_bias=False, tie_embeddings=False,
)
params = init_params(CONFIG, jax.random.PRNGKey(0))
items = random_items(21, CONFIG.vocab_size, seed=9)  # 9 rows: the two processes get 5 and 4
length = 128 if mismatch and jax.process_index() == 1 else 192
shape = RowShape(length, 96, 12)
rows, report = pack(items, shape)
try:
  scorer = Scorer(CONFIG, shape, mesh=sharding.make_mesh(mesh), batch_size=4)
  scores = collect(rows, *scorer.score(params, rows, progress=False), [len(it.candidates) for it in items])
except ValueError as e:
  print(f"process {jax.process_index()}: {e}", flush=True)
  sys.exit(3)
if jax.process_index() == 0:
  np.save(out, scores.mean_nll)
print(f"process {jax.process_index()}: {report.rows} rows scored", flush=True)
