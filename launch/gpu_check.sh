#!/usr/bin/env bash
# The whole benchmark on one accelerator in one table (launch/gpu_check.py; docs/tpu.md says what each line means),
# from the repo root:   launch/gpu_check.sh [--smoke] [--recordings=N] [--output=gpu_check.json]
# On a bare GPU host (jax with CUDA, flax, optax, orbax, torch and transformers installed), the wheels the data side
# needs beyond those (librosa, soundfile, tensorflow-datasets and what they need), carried beside the repo in
# WHEELS_DIR (default .whl), are installed first into a folder of their own, without an index. Meant to fit 8
# minutes on one H200 (not yet run on one); --smoke runs tiny shapes on a CPU.
set -euo pipefail
wheels=${WHEELS_DIR:-.whl}
if compgen -G "$wheels/*.whl" > /dev/null; then
  site=${WHEELS_TARGET:-/tmp/s2sjax-wheels}
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
python -m launch.gpu_check "$@"
