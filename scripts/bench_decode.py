"""Decoding benchmark: block efficiency, speed, where a round's time goes, and the
calibrated latency model (the cost table of `metrics.CostTable`).

For the embedded pair (its checkpoints in $SPECTR_WORKDIR/{draft,target}, trained by
scripts/train_pair.sh) or, when they are missing, random-weight models of the same sizes,
prints one row per (method, K, L), all measured in the same run:
  - block efficiency (tokens per target call) and tokens/s of `engine.generate`, beside
    the tokens/s the cost table predicts (B x batch efficiency / predicted round);
  - one round of the engine, measured, beside the round the cost table predicts and
    their ratio;
  - the round's parts each timed alone: draft (its L calls), target (one call over
    K(L + 1) positions) and verification (the block walk); the three chained in one loop
    as in a round; the engine's round function (`rounds.run_round`) in the same kind of
    loop;
  - the speedup over autoregressive decoding measured here (batch efficiency x t_AR /
    t_round), and the one the cost table predicts (block efficiency x t_AR / t_round,
    both rounds predicted: `CostTable.speedup`, as the sweep report uses it).

The cost table is written as JSON to --cost_table (default <--workdir>/cost_table.json,
i.e. $SPECTR_WORKDIR/cost_table.json or ~/.cache/spectr_jax/cost_table.json, beside the
pair it timed; `python -m experiments.report --cost_table PATH` reads it) and printed.
How it is measured: a round alternates the two models (the draft's opening call follows
the previous round's target call, the target call follows the draft's last step), and
on this CPU a call timed in a loop of its own, its weights and activations warm in the
processor's caches, costs less than it does in a round (the parts timed alone summed to
0.76-0.93 of the round in one run; the draft's opening call alone, 0.4-0.6 of what it
adds to a loop of target calls). So the draft's entries are timed in loops that alternate the
models as a round does (`model_calls`), read as differences of such loops, all timed
round-robin with the rows:
  - draft_open_ms[K] = (opening draft call on K tails, then an autoregressive target
    call) - (that target call alone): the draft call and both switches between models;
  - draft_step_ms[K] = ((the drafting of L_K calls, then the target call) - (the opening
    call, then the target call)) / (L_K - 1), L_K the largest L of the configs at K
    (in a round, as here, the steps follow one another);
  - target_ms[N] = the target call on N positions alone (its part timer): behind a draft
    call it cost the same within the noise (the increment from 1 to N positions behind a
    one-tail draft call against the call alone, 5 <= N <= 72: -10% to +7% in two runs,
    no sign), and the switch is counted in draft_open_ms;
  - verify_ms[method:K:L] = the walk alone on the round's own drafts, p and q (in a round
    its inputs are the previous call's outputs, warm too);
  - overhead_ms = the autoregressive round - its target call - its sample: the round's
    keys, commit, statistics and loop (and the engine loop against the timing loops),
    measured once; the autoregressive row's prediction equals its round by construction.
Nothing is fitted to a configuration's round: a row's prediction is the sum of the
table's parts for its (method, K, L) (`CostTable.round_ms`).

With --draft_dir and --target_dir (Hugging Face checkpoints or training runs, e.g. a
random checkpoint pair written by spectr_jax/testing/hf_checkpoints.py) it times that pair on random
prompts instead (all embedding rows are sampled: random weights, acceptance means nothing).

Configurations are `config.DecodeSpec.parse`'s short form, method[/drafting]:K:L[:branching]
(e.g. "kseq:8:4", "sd/iid:1:4", "rrs/wor:8:4:4x2x1x1"), and the table names them by
`DecodeSpec.label`. The cost table is keyed by method, K and L alone.

Usage: python scripts/bench_decode.py [--batch 4] [--max_new_tokens 64] [--repeats 5]
         [--configs autoregressive,sd:1:4,kseq:8:8,...] [--draft_dir D --target_dir T]
         [--cost_table PATH]
"""

import functools
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from spectr_jax import data, engine, metrics, pairs, plan, rounds, tables
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, count_params, get_model_config, init_params, reset_tails
from spectr_jax.pair_config import PairConfig
from spectr_jax.plan import DecodePlan, Traced
from spectr_jax.timing import interleaved_medians, seconds_per_round

DEFAULT_CONFIGS = (
  "autoregressive:1:0,sd:1:4,sd:1:8,kseq:2:4,kseq:4:4,kseq:8:4,specinfer:8:4,kseq:8:8"
)

# The script's own flags when run; private ones when imported (tests load several scripts
# into one process: their flags must not meet in absl's global FLAGS).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_BATCH = flags.DEFINE_integer("batch", 4, "Prompts (rows) per call.", flag_values=FLAGS)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 8, "Tokens per prompt.", flag_values=FLAGS)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "max_new_tokens", 64, "Tokens generated per row.", flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per timer.", flag_values=FLAGS)
_CONFIGS = flags.DEFINE_string(
  "configs", DEFAULT_CONFIGS, "method[/drafting]:K:L[:branching],...", flag_values=FLAGS
)
_WORKDIR = flags.DEFINE_string(
  "workdir", str(data.default_workdir()), "Where the pair is.", flag_values=FLAGS
)
_DRAFT_DIR = flags.DEFINE_string(
  "draft_dir", None, "A draft checkpoint or run directory.", flag_values=FLAGS
)
_TARGET_DIR = flags.DEFINE_string(
  "target_dir", None, "A target checkpoint or run directory.", flag_values=FLAGS
)
_COST_TABLE = flags.DEFINE_string(
  "cost_table", None, "Where the measured cost table goes (default <workdir>/cost_table.json).",
  flag_values=FLAGS,
)  # fmt: skip


def parse_specs(text: str, **fields) -> list[DecodeSpec]:
  """The `DecodeSpec`s of a comma-separated list of short forms (`DecodeSpec.parse`;
  `fields` set the rest, e.g. max_new_tokens)."""
  return [DecodeSpec.parse(c.strip(), **fields) for c in text.split(",") if c.strip()]


def cost_key(spec: DecodeSpec) -> tuple[str, int, int]:
  """(method, K, L): what the cost table knows of a spec."""
  return spec.method, spec.num_drafts, spec.draft_len


def load_pair(workdir):
  """The trained pair and held-out prompts, or random-weight models and random prompts."""
  try:
    pair = pairs.load_pair(PairConfig("trained", str(workdir / "draft"), str(workdir / "target")))
    return pair.draft, pair.target, pair.heldout, "embedded pair"
  except (FileNotFoundError, ValueError) as error:
    print(f"no trained pair ({error}); using random-weight models of the same sizes")
  draft_config = get_model_config("draft-tiny", 4096)
  target_config = get_model_config("target-small", 4096)
  draft = ModelBundle(draft_config, init_params(draft_config, jax.random.key(1)))
  target = ModelBundle(target_config, init_params(target_config, jax.random.key(2)))
  return draft, target, None, "random weights"


def bench_prompts(heldout, batch, prompt_len, vocab):
  """B held-out prompts of the pair, or random token ids when there is none."""
  if heldout is not None:
    prompts = data.make_prompts(heldout, batch, prompt_len, seed=0)
    return jnp.asarray(prompts.tokens_BxP), jnp.asarray(prompts.lengths_B)
  tokens = np.random.default_rng(0).integers(3, vocab, (batch, prompt_len))
  return jnp.asarray(tokens, jnp.int32), jnp.full((batch,), prompt_len, jnp.int32)


COST_TABLE = "cost_table.json"  # under --workdir, unless --cost_table names a file
CALLS = 16  # calls of a part per timed loop


def default_traced() -> Traced:
  """Temperature 1, top-p 1, rho 0 (unused: rho*), no stop token (built on first use: no
  JAX backend starts at import, so a compile-only GPU target can still be chosen)."""
  return Traced(jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.0), jnp.full((1,), -1, jnp.int32))


def _looped(step):
  """`CALLS` calls of `step(params, carry) -> carry` inside one jit, params an argument.

  Looping inside jit leaves out the per-call dispatch cost that a decode round (one
  iteration of the engine's while_loop) does not pay either; each call consumes the
  previous call's output, so nothing is hoisted out of the loop. The parameters are
  arguments, as in the engine (closed over, XLA would fold them into the program as
  constants and could pre-pack the weights of every matmul at compile time).
  """
  return jax.jit(
    lambda params, c: jax.lax.fori_loop(0, CALLS, lambda _, c: step(params, c), c),
    compiler_options=engine.compiler_options(),
  )


def _varying(*xs):
  """The arguments, made opaque to loop-invariant code motion: a part timed in a loop
  recomputes what depends on them every call, as it does once per engine round."""
  return jax.lax.optimization_barrier(xs)


def decode_plan(spec: DecodeSpec, draft, target) -> DecodePlan:
  """The plan of `spec` on these bundles (`plan.resolve`)."""
  return plan.resolve(spec, draft.config if spec.speculative else None, target.config)


def model_calls(draft_spec, target_spec, draft, target, prompts, lengths, traced=None,
                drafts_BxKxL=None):  # fmt: skip
  """A timer `(fn, args)` of a round's model calls, `CALLS` times in a loop (`_looped`):
  (`draft_spec` and `target_spec` are `DecodeSpec`s, or `plan.DecodePlan`s)
  the drafting of `draft_spec` (its L draft calls on K tails and their sampling), then the
  target call of `target_spec` (K(L + 1) positions per row and their probabilities) on
  the first draft token in every position; either spec may be None (the other model's
  calls alone; without a draft, the target scores `drafts_BxKxL` when given: a tree's
  nodes depend on them). Each call consumes the previous one's output; the tails are
  reset instead of committed."""
  traced = default_traced() if traced is None else traced
  draft_spec, target_spec = (
    decode_plan(s, draft, target) if isinstance(s, DecodeSpec) else s
    for s in (draft_spec, target_spec)
  )
  last_B = jnp.take_along_axis(prompts, (lengths - 1)[:, None], 1)[:, 0]
  b = prompts.shape[0]
  params, caches, states = [None, None], [None, None], [None, None]
  for i, spec in enumerate((draft_spec, target_spec)):
    if spec is not None:
      draft_params = draft.params if spec.draft_len else None
      init = jax.jit(functools.partial(rounds.init_state, spec))
      states[i] = init(draft_params, target.params, prompts, lengths)
      params[i] = (draft, target)[i].params
      caches[i] = (states[i].draft_cache, states[i].target_cache)[i]

  def step(params, carry):
    draft_cache, target_cache, keys, token_B = carry
    if draft_spec is not None:
      out = rounds.draw(draft_spec, params[0], draft_cache, states[0], keys, traced)
      token_B, draft_cache = out.tokens_BxKxL[:, 0, 0], reset_tails(out.cache)
    if target_spec is not None:
      shape = (b, target_spec.num_drafts, target_spec.draft_len)
      drafts = jnp.broadcast_to(token_B[:, None, None], shape)
      if draft_spec is None and drafts_BxKxL is not None:
        drafts = drafts_BxKxL + (token_B - last_B)[:, None, None]  # the same tokens
      scored = rounds.score(target_spec, params[1], target_cache, token_B, drafts, traced)
      target_cache = reset_tails(scored.cache)
      token_B = _varying(token_B + (scored.q_BxKxL1xV[:, 0, 0, 0] < 0))[0]
    return draft_cache, target_cache, jax.vmap(jax.random.fold_in)(keys, token_B), token_B

  keys = jax.random.split(jax.random.key(0), b)
  return _looped(step), (tuple(params), (*caches, keys, last_B))


def part_timers(spec, draft, target, prompts, lengths, traced=None):
  """One round's parts as timers `name -> (fn, args)`, each running the part `CALLS`
  times in a loop (see `_looped`): draft (L draft calls and their sampling), target (one
  call over K(L + 1) positions and its probabilities) and verify (the block walk on
  those p and q), and the three chained in one loop as in a round (each part's output
  feeding the next; tails reset instead of the commit): a round minus "chained" is its
  bookkeeping, "chained" minus the parts is what running them together costs (on a CPU,
  mostly weights and caches no longer warm in the processor's caches). "round loop" is
  the engine's own round (`rounds.run_round`: parts, commit, statistics, keys) in the
  same loop, from the state after the prefill, so that round and parts are timed by the
  same harness. `spec` is a `DecodeSpec` (its traced values unless `traced` is given) or a
  `plan.DecodePlan`."""
  if isinstance(spec, DecodeSpec):
    traced = plan.traced(spec) if traced is None else traced
    spec = decode_plan(spec, draft, target)
  traced = default_traced() if traced is None else traced
  draft_params = draft.params if spec.draft_len else None
  state = jax.jit(functools.partial(rounds.init_state, spec))(
    draft_params, target.params, prompts, lengths
  )
  keys = jax.random.split(jax.random.key(0), prompts.shape[0])
  timers = {}
  b, k = prompts.shape[0], spec.num_drafts
  drafts = jnp.zeros((b, k, 0), jnp.int32)
  p = None
  if spec.draft_len:
    timers["draft"] = model_calls(spec, None, draft, target, prompts, lengths, traced)
    draft_fn = jax.jit(functools.partial(rounds.draw, spec, traced=traced))
    out = draft_fn(draft_params, state.draft_cache, state, keys)
    drafts, p = out.tokens_BxKxL, out.p_BxKxLxV

  def score(params, cache, drafts):
    scored = rounds.score(spec, params, cache, state.last_B, drafts, traced)
    q, cache = scored.q_BxKxL1xV, scored.cache
    return q, reset_tails(cache)

  q, _ = jax.jit(score)(target.params, state.target_cache, drafts)
  timers["target"] = model_calls(None, spec, draft, target, prompts, lengths, traced, drafts)

  def verify_step(_, carry):
    keys, p, q = carry
    out, _, _ = rounds.walk(spec, keys, drafts, p, q, traced)
    return _varying(jax.vmap(jax.random.fold_in)(keys, out[:, 0]), p, q)

  timers["verify"] = (_looped(verify_step), (None, (keys, p, q)))

  def chained_step(params, carry):
    draft_cache, target_cache, keys = carry
    d, p = drafts, None
    if spec.draft_len:
      out = rounds.draw(spec, params[0], draft_cache, state, keys, traced)
      d, p, draft_cache = out.tokens_BxKxL, out.p_BxKxLxV, reset_tails(out.cache)
    q, target_cache = score(params[1], target_cache, d)
    out, _, _ = rounds.walk(spec, keys, d, p, q, traced)
    return draft_cache, target_cache, jax.vmap(jax.random.fold_in)(keys, out[:, 0])

  carry = (state.draft_cache, state.target_cache, keys)
  timers["chained"] = (_looped(chained_step), ((draft_params, target.params), carry))

  def round_step(params, state):
    return rounds.run_round(spec, params[0], params[1], keys, state, traced)

  timers["round loop"] = (_looped(round_step), ((draft_params, target.params), state))
  return timers


def cost_timers(specs, draft, target, prompts, lengths):
  """The drafting timers of the cost table, `(name, K) -> (fn, args)`: "open" (the
  opening draft call on K tails, L = 1) and "steps" (the drafting of the config with the
  largest L at that K), each followed by an autoregressive target call in a loop, the two
  models alternating as in a round (`model_calls`; module docstring).

  Returns:
    (timers, longest): longest[K] = (spec, L) of the drafting timed at K.
  """
  ar = specs[0].replace(method="autoregressive")
  longest = {}
  for spec in specs:
    k, n = spec.num_drafts, spec.draft_len
    if n and n >= longest.get(k, (None, 0))[1]:
      longest[k] = (spec, n)
  timers = {}
  for k, (spec, n) in longest.items():
    for name, length in (("open", 1), ("steps", n))[: 1 + (n > 1)]:
      drafted = spec.replace(draft_len=length, branching="")
      timers[(name, k)] = model_calls(drafted, ar, draft, target, prompts, lengths)
  return timers, longest


def cost_table(specs, ms, longest, round_ar_ms, draft, target, batch) -> metrics.CostTable:
  """The `metrics.CostTable` of this run (module docstring): `ms[key]` the median ms of
  one call of each timer of `bench`, specs[0] autoregressive decoding."""
  target_1 = ms[(0, "target")]
  steps = {
    k: (ms[("steps", k)] - ms[("open", k)]) / (n - 1) for k, (_, n) in longest.items() if n > 1
  }
  return metrics.CostTable(
    device=jax.devices()[0].device_kind,
    jax_version=jax.__version__,
    draft_params=count_params(draft.params),
    target_params=count_params(target.params),
    dtype=target.config.dtype,
    batch=batch,
    draft_open_ms={k: ms[("open", k)] - target_1 for k in longest},
    draft_step_ms=steps,
    target_ms={s.num_drafts * (s.draft_len + 1): ms[(i, "target")] for i, s in enumerate(specs)},
    verify_ms={metrics.verify_key(*cost_key(s)): ms[(i, "verify")] for i, s in enumerate(specs)},
    overhead_ms=round_ar_ms - target_1 - ms[(0, "verify")],
  )


def bench(draft, target, prompts, lengths, specs: list[DecodeSpec], repeats):
  """(rows, cost table): one row per `DecodeSpec` (the first must be autoregressive, the
  baseline; all of one max_new_tokens) and the `metrics.CostTable` measured in the same
  run.

  The round is (a run of `max_new_tokens` - a run of one token) / (the rounds between
  them), both one compiled program (the second stops at a traced token limit), so the
  prefill and the per-call cost of `generate` cancel. Every timer of every
  config (both runs, the parts, the chained parts, the round loop) and of the cost table
  is timed round-robin in one `interleaved_medians`, so a change of the machine's load
  moves all rows alike and ratios across rows (a method's round over K-SEQ's, a speedup
  over autoregressive decoding, a predicted round over the measured one) are as
  meaningful as those inside a row."""
  if specs[0].method != "autoregressive":
    raise ValueError(f"the first spec must be autoregressive, got {specs[0].label()}")
  max_new_tokens = specs[0].max_new_tokens
  timers, longest = cost_timers(specs, draft, target, prompts, lengths)
  runs = []
  kw = dict(draft=draft, target=target, prompts=prompts, prompt_lengths=lengths)
  for i, spec in enumerate(specs):
    # One program for both runs: the one-token run is a traced token limit.
    def run(key, token_limit=None, spec=spec):
      return engine.generate(key, spec.replace(token_limit=token_limit), **kw)

    out = run(jax.random.key(0))
    one = run(jax.random.key(0), token_limit=1)
    extra = int(np.max(np.asarray(out.stats.rounds_B)) - np.max(np.asarray(one.stats.rounds_B)))
    tokens = lambda n, run=run: run(jax.random.key(0), token_limit=n).tokens_BxT
    config_timers = {"full": (tokens, (max_new_tokens,)), "one": (tokens, (1,))}
    config_timers.update(part_timers(spec, draft, target, prompts, lengths))
    timers.update({(i, name): timer for name, timer in config_timers.items()})
    runs.append((out, extra))
    print(f"prepared {spec.label()} ({i + 1}/{len(specs)})", flush=True)
  medians = interleaved_medians(timers, repeats)
  ms = {key: 1e3 * value / CALLS for key, value in medians.items()}
  round_s = [seconds_per_round(medians[(i, "full")], medians[(i, "one")], n) for i, (_, n) in
             enumerate(runs)]  # fmt: skip
  if None in round_s:
    unresolved = [s.label() for s, seconds in zip(specs, round_s, strict=True) if seconds is None]
    raise RuntimeError(
      f"rounds not resolved for {unresolved}: the run of every round was not slower than the "
      "one-round run (timer noise); raise --max_new_tokens or --repeats"
    )
  round_ms = [1e3 * seconds for seconds in round_s]
  costs = cost_table(specs, ms, longest, round_ms[0], draft, target, prompts.shape[0])
  rows = []
  for i, spec in enumerate(specs):
    method, num_drafts, draft_len = cost_key(spec)
    out = runs[i][0]
    emitted_B = np.asarray(out.stats.emitted_B)
    efficiency = float(out.stats.block_efficiency)
    batch_efficiency = float(np.mean(emitted_B)) / int(np.max(np.asarray(out.stats.rounds_B)))
    predicted_ms = costs.round_ms(method, num_drafts, draft_len)
    rows.append(
      dict(
        config=spec.label(),
        method=method,
        K=num_drafts,
        L=draft_len,
        efficiency=efficiency,
        batch_efficiency=batch_efficiency,
        tokens_per_s=float(np.sum(np.asarray(out.lengths_B))) / medians[(i, "full")],
        predicted_tokens_per_s=costs.tokens_per_s(batch_efficiency, method, num_drafts, draft_len),
        round_ms=round_ms[i],
        predicted_ms=predicted_ms,
        predicted_over_round=predicted_ms / round_ms[i],
        draft_ms=ms.get((i, "draft"), 0.0),
        target_ms=ms[(i, "target")],
        verify_ms=ms[(i, "verify")],
        chained_ms=ms[(i, "chained")],
        round_loop_ms=ms[(i, "round loop")],
        # Tokens per round of the batch (rows move in lockstep) x t_AR / t_round.
        measured=batch_efficiency * round_ms[0] / round_ms[i],
        predicted=costs.speedup(efficiency, method, num_drafts, draft_len),
      )
    )
  return rows, costs


def format_table(rows):
  cols = (
    ("config", "config", "{}"),
    ("efficiency", "block eff.", "{:.2f}"),
    ("batch_efficiency", "batch eff.", "{:.2f}"),
    ("tokens_per_s", "tokens/s", "{:.1f}"),
    ("predicted_tokens_per_s", "predicted tokens/s", "{:.1f}"),
    ("round_ms", "round ms", "{:.2f}"),
    ("predicted_ms", "predicted round ms", "{:.2f}"),
    ("predicted_over_round", "predicted / measured", "{:.2f}"),
    ("draft_ms", "draft ms", "{:.2f}"),
    ("target_ms", "target ms", "{:.2f}"),
    ("verify_ms", "verify ms", "{:.2f}"),
    ("chained_ms", "parts chained ms", "{:.2f}"),
    ("round_loop_ms", "round loop ms", "{:.2f}"),
    ("measured", "speedup measured", "{:.2f}x"),
    ("predicted", "predicted speedup (measured costs)", "{:.2f}x"),
  )
  return tables.markdown(rows, cols)


def format_costs(costs: metrics.CostTable) -> str:
  """The cost table as text: one line per part."""
  lines = [f"cost table ({costs.describe()}), ms:"]
  for name in ("draft_open_ms", "draft_step_ms", "target_ms", "verify_ms"):
    parts = ", ".join(f"{key}: {value:.3f}" for key, value in getattr(costs, name).items())
    lines.append(f"  {name} {{{parts}}}")
  lines.append(f"  overhead_ms {costs.overhead_ms:.3f}")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if (_DRAFT_DIR.value is None) != (_TARGET_DIR.value is None):
    raise app.UsageError("--draft_dir and --target_dir go together")
  if _DRAFT_DIR.value:
    draft, target = (pairs.load_model(d) for d in (_DRAFT_DIR.value, _TARGET_DIR.value))
    heldout, what = None, f"loaded {_DRAFT_DIR.value} / {_TARGET_DIR.value}"
  else:
    draft, target, heldout, what = load_pair(pathlib.Path(_WORKDIR.value))
  batch, max_new_tokens = _BATCH.value, _MAX_NEW_TOKENS.value
  prompts, lengths = bench_prompts(heldout, batch, _PROMPT_LEN.value, target.config.vocab_size)
  specs = parse_specs(_CONFIGS.value, max_new_tokens=max_new_tokens)
  if specs[0].method != "autoregressive":
    specs.insert(0, DecodeSpec("autoregressive", max_new_tokens=max_new_tokens))
  print(
    f"{what}: draft {count_params(draft.params):,} params, target "
    f"{count_params(target.params):,}; batch {batch}, {max_new_tokens} new tokens; "
    f"backend {jax.default_backend()}"
  )
  rows, costs = bench(draft, target, prompts, lengths, specs, _REPEATS.value)
  path = pathlib.Path(_COST_TABLE.value or pathlib.Path(_WORKDIR.value) / COST_TABLE)
  path = path.expanduser()
  costs.save(path)
  print(f"load average after the run: {os.getloadavg()[0]:.2f}")
  print(f"\n{format_costs(costs)}\nwritten to {path}\n")
  print(format_table(rows))


if __name__ == "__main__":
  app.run(main)
