#!/usr/bin/env bash
# The README's GPU figures in one run, on a GPU host with jax (CUDA), flax, orbax, torch and transformers, from the
# repo root:   launch/gpu_bench.sh [RESULTS_DIR] [WORK_DIR]
#   1. the tiny shape, every kernel x layout: stops here when nothing runs (the big shapes would not either);
#   2. the accelerator table (Qwen2.5-7B, 1.5B, 0.5B shapes, random weights, bf16): XLA's attention and cuDNN's
#      fused kernel, over rows without sharing, shared rows (7B) and shared rows with item-local attention;
#   3. the PyTorch reference protocol beside s2sjax on the same GPU, same random Qwen2.5-0.5B weights, bf16.
# Results: accelerator*.json, reference.json and the printed tables. Checkpoints go to WORK_DIR (default /tmp).
set -euo pipefail
results=${1:-gpu_bench}
work=${2:-/tmp/s2sjax-gpu-bench}
mkdir -p "$results" "$work"
accelerator() { python -m s2sjax.bench --mode=accelerator --row_length=2048 --rows=8 --dtype=bfloat16 "$@"; }

accelerator --sizes=tiny --attention=xla,cudnn --protocols=noshare,local --output="$results/accelerator_tiny.json"
grep -q tokens_per_s "$results/accelerator_tiny.json" || { echo "no configuration ran: stopping"; exit 1; }
accelerator --sizes=qwen2.5-7b --attention=xla,cudnn --protocols=noshare,shared,local \
  --output="$results/accelerator_7b.json"
accelerator --sizes=qwen2.5-0.5b,qwen2.5-1.5b --attention=xla,cudnn --protocols=noshare,local \
  --output="$results/accelerator_small.json"

# the reference comparison on cuDNN's kernel where the tiny shape ran on it, else XLA's
kernel=$(python -c "import json, sys; rows = json.load(open(sys.argv[1]))
print('cudnn' if any(r['attention'] == 'cudnn' and 'tokens_per_s' in r for r in rows) else 'dot_product')" \
  "$results/accelerator_tiny.json")
python -m checkpoints_conversion.random_source --shape=qwen2.5-0.5b --output="$work/hf-0.5b"
python -m checkpoints_conversion.convert --source="$work/hf-0.5b" --output="$work/ckpt-0.5b" --overwrite
# torch shares the GPU with JAX here: JAX takes half of it, not its default three quarters
XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 python -m s2sjax.bench --checkpoint="$work/ckpt-0.5b" --workload=stories,speech \
  --items=256 --dtype=bfloat16 --attention="$kernel" --batch_size=8 --ref_batch_size=32 --output="$results/reference.json"
