"""Starts a JAX distributed run of several local CPU processes, for tests.

`launch` starts `num_processes` Python processes running `tests.multiprocess_worker`
(the checks each process runs are its arguments), each with `devices_per_process` fake
CPU devices, joined by `jax.distributed` through a coordinator on a free localhost port:
the environment that `sharding.maybe_initialize_distributed` reads (JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID). Cross-process CPU collectives go over gloo.

It waits for all processes (killing every one still running at the timeout) and returns
each one's exit code, output and end time. New checks are functions added to the worker's
`CHECKS`; the harness needs no change.
"""

import contextlib
import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Finished:
  """One process of a launch.

  returncode: its exit status (negative: killed by that signal; -9 also at the timeout).
  output: its stdout and stderr, interleaved.
  seconds: when it ended, in seconds after the launch (polled every 0.05 s).
  timed_out: it was still running at the timeout (and was killed).
  """

  returncode: int
  output: str
  seconds: float
  timed_out: bool


def free_port() -> int:
  """A TCP port on localhost that is free now (the coordinator binds it soon after)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def worker_env(process_id: int, num_processes: int, port: int, devices: int) -> dict[str, str]:
  """The environment of process `process_id`: CPU only, `devices` fake devices, the
  coordinator's address and this process's place in the run, this checkout on the path."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
  env.update(
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
    PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
    JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
    JAX_NUM_PROCESSES=str(num_processes),
    JAX_PROCESS_ID=str(process_id),
  )
  return env


def launch(
  args: Sequence[str],
  num_processes: int = 2,
  devices_per_process: int = 4,
  timeout: float = 240.0,
) -> list[Finished]:
  """Runs `python -m tests.multiprocess_worker *args` as one JAX run of `num_processes`.

  Args:
    args: the worker's arguments (its checks and options), the same for every process.
    num_processes: processes in the run (process 0 hosts the coordinator).
    devices_per_process: fake CPU devices of each process.
    timeout: seconds until every process still running is killed.

  Returns:
    The processes by process id, each with exit code, output and end time.
  """
  port = free_port()
  command = [sys.executable, "-m", "tests.multiprocess_worker", *args]
  with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stack:
    files = [
      stack.enter_context(open(pathlib.Path(logs) / f"{i}.log", "w+")) for i in range(num_processes)
    ]
    start = time.perf_counter()
    processes = [
      subprocess.Popen(
        command,
        cwd=REPO,
        env=worker_env(i, num_processes, port, devices_per_process),
        stdout=f,
        stderr=subprocess.STDOUT,
      )
      for i, f in enumerate(files)
    ]
    ended: dict[int, float] = {}
    try:
      while len(ended) < num_processes and time.perf_counter() - start < timeout:
        for i, p in enumerate(processes):
          if i not in ended and p.poll() is not None:
            ended[i] = time.perf_counter() - start
        time.sleep(0.05)
    finally:
      for p in processes:
        if p.poll() is None:
          p.send_signal(signal.SIGKILL)
        p.wait()
    finished = []
    for i, (p, f) in enumerate(zip(processes, files, strict=True)):
      f.seek(0)
      output = f.read()
      seconds = ended.get(i, time.perf_counter() - start)
      finished.append(Finished(p.returncode, output, seconds, i not in ended))
  return finished


def describe(finished: Sequence[Finished], tail: int = 3000) -> str:
  """Each process's exit code, end time and the tail of its output (for assertion messages)."""
  return "\n".join(
    f"--- process {i}: exit {f.returncode} at {f.seconds:.1f} s"
    f"{' (timed out)' if f.timed_out else ''}\n{f.output[-tail:]}"
    for i, f in enumerate(finished)
  )
