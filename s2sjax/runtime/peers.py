"""A dead peer ends a multi-process run with a clear error, in bounded time.

Without this, a process whose peer died (a preempted worker) waits in a collective until the JAX distributed
runtime's own heartbeat gives up (`heartbeat_timeout_seconds`, 100 s by default) and then aborts the whole
process with a C++ fatal error and SIGABRT. Here each process publishes a counter in the coordination service's
key-value store every `timeout_s / 4` seconds and watches the others'; a peer whose counter has not moved for
`timeout_s` (as measured on this host: no clock is compared across hosts), or a coordination service that stops
answering for as long (process 0, which hosts it, died), ends this process with one line on stderr and exit code
1. A process that finishes publishes that it is done, so a peer still writing files does not take it for dead.
The runtime's own heartbeat is set longer (`runtime_heartbeat_s`), so this watch always speaks first.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

DONE = "done"


def define_flags() -> None:
  """The flags of a command that runs as one process of many (`s2sjax.eval`, `tasks.prepare`)."""
  from absl import flags

  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() first (TPU pods, multi-host GPU).")
  flags.DEFINE_string("coordinator_address", None, "With --distributed off a managed cluster: host:port of process 0.")
  flags.DEFINE_integer("num_processes", None, "With --coordinator_address: how many processes.")
  flags.DEFINE_integer("process_id", None, "With --coordinator_address: this process's index.")
  flags.DEFINE_enum("cpu_collectives", None, ["gloo", "mpi"], "CPU collectives for multi-process runs on CPUs.")
  flags.DEFINE_float("peer_timeout_s", 30.0, "With --distributed: a peer silent this long ends every process with "
                     "an error (s2sjax/runtime/peers.py).", lower_bound=2.0)


def start_from_flags() -> None:
  """`define_flags`' settings applied: the CPU collectives, then, with --distributed, JAX's multi-process runtime
  (TPU VMs and managed clusters find their peers; elsewhere --coordinator_address names process 0) and the watch
  that ends every process when one dies."""
  import jax
  from absl import flags

  given = flags.FLAGS
  if given.cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", given.cpu_collectives)
  if given.distributed:
    jax.distributed.initialize(given.coordinator_address, given.num_processes, given.process_id,
                               heartbeat_timeout_seconds=runtime_heartbeat_s(given.peer_timeout_s))
    PeerWatch(given.peer_timeout_s).start()


def runtime_heartbeat_s(timeout_s: float) -> int:
  """The distributed runtime's heartbeat timeout to pair with a watch of `timeout_s`: well after it."""
  return int(max(100, 3 * timeout_s))


class PeerWatch:
  def __init__(self, timeout_s: float):
    from jax._src import distributed  # the client jax.distributed.initialize() made; no public handle exists

    import jax

    self.client = distributed.global_state.client
    self.me, self.count = jax.process_index(), jax.process_count()
    self.timeout_s, self.every_s = timeout_s, timeout_s / 4
    self._thread = threading.Thread(target=self._run, name="s2sjax-peer-watch", daemon=True)
    self._finished = False

  def _key(self, process: int) -> str:
    return f"s2sjax/alive/{process}"

  def start(self) -> "PeerWatch":
    self._thread.start()
    atexit.register(self.finish)  # registered after jax's own shutdown hook, so it runs before it
    return self

  def finish(self) -> None:
    """This process is done: its peers stop watching it. It keeps watching them: a peer that dies while this one
    waits for it at the runtime's shutdown barrier still ends it."""
    self._finished = True
    try:
      self.client.key_value_set(self._key(self.me), DONE, allow_overwrite=True)
    except Exception:  # noqa: BLE001 - the service may already be gone at exit; nothing is owed to it then
      pass

  def _run(self) -> None:
    beat, last_seen, changed_at, reached = 0, {}, {}, time.monotonic()
    while True:
      time.sleep(self.every_s)
      now = time.monotonic()
      try:
        beat += 1
        if not self._finished:
          self.client.key_value_set(self._key(self.me), str(beat), allow_overwrite=True)
        for peer in range(self.count):
          if peer == self.me:
            continue
          try:
            value = self.client.key_value_try_get(self._key(peer))
          except Exception as e:  # noqa: BLE001 - NOT_FOUND: the peer has not published yet
            if "NOT_FOUND" not in str(e):
              raise
            value = None
          if value == DONE:
            continue
          if value != last_seen.get(peer) or peer not in changed_at:
            last_seen[peer], changed_at[peer] = value, now
          elif now - changed_at[peer] > self.timeout_s:
            _die(f"process {peer} of {self.count} stopped answering {now - changed_at[peer]:.0f}s ago (dead or "
                 "preempted); ending this one too. Rerun into the same --output_dir to resume.")
        reached = now
      except Exception as e:  # noqa: BLE001 - any failure to reach the coordination service
        if now - reached > self.timeout_s:
          _die(f"lost the coordination service on process 0 for {now - reached:.0f}s ({type(e).__name__}); "
               "ending this process. Rerun into the same --output_dir to resume.")


def _die(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  os._exit(1)  # the main thread may be blocked in a collective: no clean unwinding is possible
