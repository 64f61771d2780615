"""The machine a CPU benchmark ran on, as its last line names it: the processor, its cores, and how fast one
matmul goes in torch (the PyTorch reference's BLAS) and in XLA (s2sjax's)."""

from __future__ import annotations

import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np


def torch_dtype(dtype):
  """The torch dtype of a JAX dtype (or its name)."""
  import torch

  return getattr(torch, jnp.dtype(dtype).name)


def cpu_machine(dtype) -> dict:
  """The processor, its cores and the matmul probe, for a run on the CPU (an accelerator's run names its device)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"processor": processor(), "cores": cores, "matmul": matmul_speeds(dtype)}


def processor() -> str:
  """The CPU's model name where Linux tells it, else what `platform` knows."""
  try:
    with open("/proc/cpuinfo") as f:
      return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def matmul_speeds(dtype, size: int = 2048, repeats: int = 5) -> dict:
  """GFLOP/s of one [size x size] @ [size x size] matmul in `dtype` on the CPU, best of `repeats` after a warm-up,
  for torch (the reference's BLAS) and XLA (s2sjax's, at the precision the decoder asks for)."""
  import torch

  a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
  x = torch.from_numpy(a).to(dtype=torch_dtype(dtype))
  y = jax.device_put(jnp.asarray(a, dtype), jax.devices("cpu")[0])
  precision = jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None
  xla_matmul = jax.jit(lambda m: jnp.dot(m, m, precision=precision))

  def best(run) -> float:
    run()
    seconds = []
    for _ in range(repeats):
      start = time.perf_counter()
      run()
      seconds.append(time.perf_counter() - start)
    return round(2 * size**3 / min(seconds) / 1e9, 1)

  return {"size": size, "dtype": jnp.dtype(dtype).name, "torch_gflops": best(lambda: x @ x),
          "xla_gflops": best(lambda: xla_matmul(y).block_until_ready())}


def machine_line(machine: dict) -> str:
  """The machine as the bench's last line prints it."""
  speeds = machine["matmul"]
  return (f"machine: {machine['processor']}, {machine['cores']} cores; one {speeds['size']}^2 {speeds['dtype']} "
          f"matmul: torch {speeds['torch_gflops']:.0f} GFLOP/s, XLA {speeds['xla_gflops']:.0f} GFLOP/s")
