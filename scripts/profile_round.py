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

Configurations are `config.DecodeSpec.parse`'s method[/drafting]:K:L[:branching] (e.g.
"sd/iid:1:4", "rrs:8:4:4x2x1x1"), named in the tables by `DecodeSpec.label`.

Usage: python scripts/profile_round.py [--configs sd:1:4,kseq:8:4] [--batch 4]
         [--max_new_tokens 64] [--repeats 3] [--loops]
"""

import collections
import functools
import pathlib
import re
import tempfile

import jax
import jax.numpy as jnp
from absl import app, flags
from bench_decode import CALLS, bench_prompts, load_pair, parse_specs, part_timers

from spectr_jax import data, engine, tables

# The script's own flags when run; private ones when imported (bench_decode.FLAGS).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_CONFIGS = flags.DEFINE_string(
  "configs", "autoregressive:1:0,sd:1:4,sd:1:8,kseq:8:4,kseq:8:8",
  "method[/drafting]:K:L[:branching],...", flag_values=FLAGS,
)  # fmt: skip
_BATCH = flags.DEFINE_integer("batch", 4, "Prompts (rows) per call.", flag_values=FLAGS)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 8, "Tokens per prompt.", flag_values=FLAGS)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "max_new_tokens", 64, "Tokens generated per row.", flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Profiled runs per config.", flag_values=FLAGS)
_WORKDIR = flags.DEFINE_string(
  "workdir", str(data.default_workdir()), "Where the pair is.", flag_values=FLAGS
)
_LOOPS = flags.DEFINE_bool(
  "loops", False, "Busy vs span of bench_decode's chained and round loops.", flag_values=FLAGS
)

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


def loop_table(draft, target, prompts, lengths, specs, repeats: int) -> str:
  """busy and span of bench_decode's loops "chained" (the three parts) and "round loop"
  (`rounds.run_round`), per call, for each `DecodeSpec`."""
  rows = []
  for spec in specs:
    timers = part_timers(spec, draft, target, prompts, lengths)
    for loop in ("chained", "round loop"):
      ops, busy, span = busy_and_span(*timers[loop], repeats)
      row = {"config": spec.label(), "loop": loop, "ops": ops / CALLS}
      row.update(busy_ms=1e3 * busy / CALLS, span_ms=1e3 * span / CALLS, ratio=busy / span)
      rows.append(row)
  cols = [("config", "config", "{}"), ("loop", "loop", "{}")]
  cols += [("ops", "ops per call", "{:.0f}"), ("busy_ms", "busy ms", "{:.2f}")]
  cols += [("span_ms", "span ms", "{:.2f}"), ("ratio", "busy / span", "{:.2f}")]
  return tables.markdown(rows, cols)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  draft, target, heldout, what = load_pair(pathlib.Path(_WORKDIR.value))
  batch, max_new_tokens = _BATCH.value, _MAX_NEW_TOKENS.value
  prompts, lengths = bench_prompts(heldout, batch, _PROMPT_LEN.value, target.config.vocab_size)
  specs = parse_specs(_CONFIGS.value, max_new_tokens=max_new_tokens)
  print(f"{what}; batch {batch}, {max_new_tokens} new tokens")
  if _LOOPS.value:
    print(loop_table(draft, target, prompts, lengths, specs, _REPEATS.value))
    return
  rows = []
  kw = dict(draft=draft, target=target, prompts=prompts, prompt_lengths=lengths)
  for spec in specs:
    run = functools.partial(engine.generate, jax.random.key(0), spec, **kw)
    lowered = engine.lower(jax.random.key(0), spec, **kw)
    split, thunks = phase_split(run, lowered.compile().as_text(), _REPEATS.value)
    num_rounds = int(jnp.max(run().stats.rounds_B))
    row = {"config": spec.label(), "thunks": thunks / num_rounds}
    round_s = sum(split.values())
    row["round_ms"] = 1e3 * round_s / num_rounds
    for phase in COLUMNS:
      row[phase] = split.get(phase, 0.0) / round_s
    rows.append(row)
  cols = [("config", "config", "{}")]
  cols += [("round_ms", "round ms (profiled)", "{:.2f}"), ("thunks", "ops run", "{:.0f}")]
  cols += [(phase, phase, "{:.1%}") for phase in COLUMNS]
  print(tables.markdown(rows, cols))


if __name__ == "__main__":
  app.run(main)
