"""Where a decoding round's time goes, from a `jax.profiler` trace of the engine itself.

Runs `engine.generate` on the embedded pair (or random-weight models of its sizes) under
`jax.profiler.trace` and sums the duration of every executed XLA operation (on the CPU,
each thunk) by the phase of the round it belongs to: the named scopes of
`rounds.run_round` (keys, draft, score, verify, commit, stats), read from the compiled
program's op_name metadata. An operation without metadata counts for the phase of the
operation executed before it on the same thread; operations outside the loop of rounds
(the prefill) are left out. Unlike bench_decode.py's parts, timed alone in loops of their
own, these are the phases as they run inside the engine's program. Profiling adds a cost
to every operation, so the figures are inflated by about a microsecond per operation; the
shares are what to read.

With --loops it profiles instead bench_decode.py's loop of the three parts chained and
its loop of the engine's round function, and prints per call the operations run, their
summed time (busy) and the wall time they spanned: on a multi-core CPU independent
operations overlap (busy > span) and dependent ones leave the cores waiting (busy < span),
which moves a loop's wall time without any work added or removed.

Usage: python scripts/profile_round.py [--configs sd:1:4,kseq:8:4] [--batch 4]
         [--max_new_tokens 64] [--repeats 3] [--loops]
"""

import argparse
import collections
import functools
import pathlib
import re
import tempfile

import jax
import jax.numpy as jnp
from bench_decode import CALLS, bench_prompts, load_pair, part_timers

from spectr_jax import data, engine, rounds
from spectr_jax.timing import markdown_table

PHASES = ("keys", "draft", "score", "verify", "commit", "stats")
COLUMNS = PHASES + ("loop",)  # loop: the loop of rounds' own operations (its condition)


def op_phases(hlo_text: str) -> dict[str, str | None]:
  """Instruction name -> its round phase ("loop" in the loop of rounds but in no phase,
  "" outside the loop, None without metadata), for every instruction of the compiled
  program that is not a control-flow container."""
  phases = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = \S+ ([\w\-]+)\(", line)
    if not m or m.group(2) in ("while", "conditional", "call"):
      continue
    name = re.search(r'op_name="([^"]*)"', line)
    phase = None
    if name:
      scopes = name.group(1).split("/")
      phase = next((p for p in PHASES if p in scopes), "loop" if "while" in scopes else "")
    phases[m.group(1)] = phase
  return phases


def _trace(run, repeats: int):
  """The executed operations of `repeats` runs of `run` (after a warm-up run), per
  profiler line (thread): lists of (name, start ns, duration ns) in start order."""
  jax.block_until_ready(run())
  with tempfile.TemporaryDirectory() as directory:
    with jax.profiler.trace(directory):
      for _ in range(repeats):
        jax.block_until_ready(run())
    (path,) = pathlib.Path(directory).rglob("*.xplane.pb")
    profile = jax.profiler.ProfileData.from_file(str(path))
  return [
    sorted(((e.name, e.start_ns, e.duration_ns) for e in line.events), key=lambda e: e[1])
    for plane in profile.planes
    for line in plane.lines
  ]


def phase_split(run, compiled_text: str, repeats: int) -> tuple[dict[str, float], int]:
  """Seconds per run of each phase (summed over the run's rounds) and the thunks run."""
  phases = op_phases(compiled_text)
  total = collections.Counter()
  count = 0
  for events in _trace(run, repeats):
    current = ""
    for name, _, duration in events:
      if name not in phases:
        continue
      phase = phases[name]
      current = current if phase is None else phase
      if current:
        total[current] += duration * 1e-9 / repeats
        count += 1
  return dict(total), count // repeats


def busy_and_span(fn, args, repeats: int) -> tuple[int, float, float]:
  """(operations, busy s, span s) per call of the jitted `fn(*args)`: busy sums the
  operations' own times over all threads, span runs from the first one's start to the
  last one's end. busy > span: independent operations overlapped on several cores;
  busy < span: the threads waited between operations."""
  names = set(op_phases(fn.lower(*args).compile().as_text()))
  events = [e for line in _trace(lambda: fn(*args), repeats) for e in line if e[0] in names]
  start = min(e[1] for e in events)
  end = max(e[1] + e[2] for e in events)
  busy = sum(e[2] for e in events)
  return len(events) // repeats, busy * 1e-9 / repeats, (end - start) * 1e-9 / repeats


def loop_table(draft, target, prompts, lengths, configs, repeats: int) -> str:
  """busy and span of bench_decode's loops "chained" (the three parts) and "round loop"
  (`rounds.run_round`), per call, for each config."""
  traced = rounds.Traced(
    jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.0), jnp.full((1,), -1, jnp.int32)
  )
  rows = []
  for method, k, n in configs:
    spec = engine.DecodeSpec(
      method, k, n, 64, None, False, "star", draft.config if n else None, target.config
    )  # fmt: skip
    timers = part_timers(spec, draft, target, prompts, lengths, traced)
    for loop in ("chained", "round loop"):
      ops, busy, span = busy_and_span(*timers[loop], repeats)
      row = {"method": method, "K": k, "L": n, "loop": loop, "ops": ops / CALLS}
      row.update(busy_ms=1e3 * busy / CALLS, span_ms=1e3 * span / CALLS, ratio=busy / span)
      rows.append(row)
  cols = [("method", "method", "{}"), ("K", "K", "{}"), ("L", "L", "{}"), ("loop", "loop", "{}")]
  cols += [("ops", "ops per call", "{:.0f}"), ("busy_ms", "busy ms", "{:.2f}")]
  cols += [("span_ms", "span ms", "{:.2f}"), ("ratio", "busy / span", "{:.2f}")]
  return markdown_table(rows, cols)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default="autoregressive:1:0,sd:1:4,sd:1:8,kseq:8:4,kseq:8:8")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--prompt_len", type=int, default=8)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--workdir", default=str(data.default_workdir()))
  parser.add_argument(
    "--loops", action="store_true", help="busy vs span of bench_decode's chained and round loops"
  )
  args = parser.parse_args()
  draft, target, heldout, what = load_pair(pathlib.Path(args.workdir))
  prompts, lengths = bench_prompts(heldout, args.batch, args.prompt_len, target.config.vocab_size)
  traced = rounds.Traced(
    jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.0), jnp.full((1,), -1, jnp.int32)
  )
  print(f"{what}; batch {args.batch}, {args.max_new_tokens} new tokens")
  if args.loops:
    configs = [(m, int(k), int(n)) for m, k, n in (c.split(":") for c in args.configs.split(","))]
    print(loop_table(draft, target, prompts, lengths, configs, args.repeats))
    return
  rows = []
  for config in args.configs.split(","):
    method, k, n = config.split(":")
    k, n = int(k), int(n)
    run = functools.partial(
      engine.generate, jax.random.key(0), draft=draft, target=target, prompts=prompts,
      prompt_lengths=lengths, method=method, num_drafts=k, draft_len=n,
      max_new_tokens=args.max_new_tokens,
    )  # fmt: skip
    spec = engine.DecodeSpec(
      method, k, n, args.max_new_tokens, None, False, "star",
      draft.config if n else None, target.config,
    )  # fmt: skip
    ids = jnp.arange(args.batch, dtype=jnp.int32)
    lowered = engine.compiled_program(spec).lower(
      jax.random.key(0), ids, prompts, lengths, draft.params if n else None, target.params, traced
    )
    split, thunks = phase_split(run, lowered.compile().as_text(), args.repeats)
    num_rounds = int(jnp.max(run().stats.rounds_B))
    row = {"method": method, "K": k, "L": n, "thunks": thunks / num_rounds}
    round_s = sum(split.values())
    row["round_ms"] = 1e3 * round_s / num_rounds
    for phase in COLUMNS:
      row[phase] = split.get(phase, 0.0) / round_s
    rows.append(row)
  cols = [("method", "method", "{}"), ("K", "K", "{}"), ("L", "L", "{}")]
  cols += [("round_ms", "round ms (profiled)", "{:.2f}"), ("thunks", "ops run", "{:.0f}")]
  cols += [(phase, phase, "{:.1%}") for phase in COLUMNS]
  print(markdown_table(rows, cols))


if __name__ == "__main__":
  main()
