"""Decoding benchmark: block efficiency, speed and where a round's time goes.

For the embedded pair (its checkpoints in $SPECTR_WORKDIR/{draft,target}, trained by
scripts/train_pair.sh) or, when they are missing, random-weight models of the same sizes,
prints one row per (method, K, L), all measured in the same run:
  - block efficiency (tokens per target call) and tokens/s of `engine.generate`;
  - wall-clock speedup over autoregressive decoding measured here;
  - one round's time split into draft (L steps), target (one call over K(L+1) positions)
    and verification (the block walk), each timed alone; the three chained in one loop
    as in a round; the engine's round function (`rounds.run_round`) in the same kind of
    loop; the round over the sum of the parts, and the bookkeeping share
    1 - chained / round (the commit, the statistics, the keys and the loop itself);
  - the predicted accelerator speedup of the latency model in `metrics.predicted_speedup`
    (target call flat in K(L+1), draft step cost = parameter ratio).

With --draft_dir and --target_dir (Hugging Face checkpoints or training runs, e.g. a
random checkpoint pair written by tests/hf_checkpoints.py) it times that pair on random
prompts instead (all embedding rows are sampled: random weights, acceptance means nothing).

Usage: python scripts/bench_decode.py [--batch 4] [--max_new_tokens 64]
         [--configs autoregressive:1:0,sd:1:4,kseq:8:8,...] [--draft_dir D --target_dir T]
"""

import argparse
import functools
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import data, engine, pairs, rounds
from spectr_jax.config import DecodeSettings, PairConfig
from spectr_jax.metrics import predicted_speedup
from spectr_jax.models import ModelBundle, count_params, get_model_config, init_params, reset_tails
from spectr_jax.timing import interleaved_medians

DEFAULT_CONFIGS = (
  "autoregressive:1:0,sd:1:4,sd:1:8,kseq:2:4,kseq:4:4,kseq:8:4,specinfer:8:4,kseq:8:8"
)


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


CALLS = 16  # calls of a part per timed loop


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


def part_timers(spec, draft, target, prompts, lengths, traced=None):
  """One round's parts as timers `name -> (fn, args)`, each running the part `CALLS`
  times in a loop (see `_looped`): draft (L draft steps and their sampling), target (one
  call over K(L + 1) positions and its probabilities) and verify (the block walk on
  those p and q), and the three chained in one loop as in a round (each part's output
  feeding the next; tails reset instead of the commit): a round minus "chained" is its
  bookkeeping, "chained" minus the parts is what running them together costs (on a CPU,
  mostly weights and caches no longer warm in the processor's caches). "round loop" is
  the engine's own round (`rounds.run_round`: parts, commit, statistics, keys) in the
  same loop, from the state after the prefill, so that round and parts are timed by the
  same harness."""
  if traced is None:
    traced = rounds.Traced(
      jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.0), jnp.full((1,), -1, jnp.int32)
    )
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

    def draft_step(params, carry):
      cache, keys = carry
      out = rounds.draft(spec, params, cache, state, keys, traced)
      return reset_tails(out.cache), jax.vmap(jax.random.fold_in)(keys, out.tokens_BxKxL[:, 0, 0])

    timers["draft"] = (_looped(draft_step), (draft_params, (state.draft_cache, keys)))
    draft_fn = jax.jit(functools.partial(rounds.draft, spec, traced=traced))
    out = draft_fn(draft_params, state.draft_cache, state, keys)
    drafts, p = out.tokens_BxKxL, out.p_BxKxLxV

  def score(params, cache, drafts):
    scored = rounds.score(spec, params, cache, state.last_B, drafts, traced)
    q, cache = scored.q_BxKxL1xV, scored.cache
    return q, reset_tails(cache)

  def target_step(params, carry):
    q, cache, drafts = carry
    q, cache = score(params, cache, drafts)
    return q, cache, _varying(drafts + (q[:, :1, :1, 0] < 0))[0]

  q, _ = jax.jit(score)(target.params, state.target_cache, drafts)
  timers["target"] = (_looped(target_step), (target.params, (q, state.target_cache, drafts)))

  def verify_step(_, carry):
    keys, p, q = carry
    out, _, _ = rounds.verify_rows(spec, keys, drafts, p, q, traced)
    return _varying(jax.vmap(jax.random.fold_in)(keys, out[:, 0]), p, q)

  timers["verify"] = (_looped(verify_step), (None, (keys, p, q)))

  def chained_step(params, carry):
    draft_cache, target_cache, keys = carry
    d, p = drafts, None
    if spec.draft_len:
      out = rounds.draft(spec, params[0], draft_cache, state, keys, traced)
      d, p, draft_cache = out.tokens_BxKxL, out.p_BxKxLxV, reset_tails(out.cache)
    q, target_cache = score(params[1], target_cache, d)
    out, _, _ = rounds.verify_rows(spec, keys, d, p, q, traced)
    return draft_cache, target_cache, jax.vmap(jax.random.fold_in)(keys, out[:, 0])

  carry = (state.draft_cache, state.target_cache, keys)
  timers["chained"] = (_looped(chained_step), ((draft_params, target.params), carry))

  def round_step(params, state):
    return rounds.run_round(spec, params[0], params[1], keys, state, traced)

  timers["round loop"] = (_looped(round_step), ((draft_params, target.params), state))
  return timers


def bench(draft, target, prompts, lengths, configs, settings: DecodeSettings, repeats):
  """One row per (method, K, L); the first config must be autoregressive (the baseline).

  The round is (a run of `max_new_tokens` - a run of one token) / (the rounds between
  them), so the prefill and the per-call cost of `generate` cancel. Every timer of every
  config (both runs, the parts, the chained parts, the round loop) is timed round-robin
  in one `interleaved_medians`, so a change of the machine's load moves all rows alike
  and ratios across rows (a method's round over K-SEQ's, a speedup over autoregressive
  decoding) are as meaningful as those inside a row."""
  cost_ratio = count_params(draft.params) / count_params(target.params)
  max_new_tokens = settings.max_new_tokens
  timers, runs = {}, []
  for i, (method, num_drafts, draft_len) in enumerate(configs):
    kw = dict(draft=draft, target=target, prompts=prompts, prompt_lengths=lengths)
    kw.update(method=method, num_drafts=num_drafts, draft_len=draft_len)
    kw.update(settings.sampling_args())
    run = functools.partial(engine.generate, **kw)
    out = run(jax.random.key(0), max_new_tokens=max_new_tokens)
    one = run(jax.random.key(0), max_new_tokens=1)
    extra = int(np.max(np.asarray(out.stats.rounds_B)) - np.max(np.asarray(one.stats.rounds_B)))
    tokens = lambda n, run=run: run(jax.random.key(0), max_new_tokens=n).tokens_BxT
    spec = engine.DecodeSpec(
      method, num_drafts, draft_len, max_new_tokens, None, False, "star",
      draft.config if draft_len else None, target.config,
    )  # fmt: skip
    config_timers = {"full": (tokens, (max_new_tokens,)), "one": (tokens, (1,))}
    config_timers.update(part_timers(spec, draft, target, prompts, lengths))
    timers.update({(i, name): timer for name, timer in config_timers.items()})
    runs.append((out, extra))
    print(f"prepared {method}:{num_drafts}:{draft_len} ({i + 1}/{len(configs)})", flush=True)
  medians = interleaved_medians(timers, repeats)
  rows = []
  for i, (method, num_drafts, draft_len) in enumerate(configs):
    t = {name: value for (j, name), value in medians.items() if j == i}
    out, extra = runs[i]
    round_s = (t["full"] - t["one"]) / max(extra, 1)
    parts = {name: t.get(name, 0.0) / CALLS for name in ("draft", "target", "verify")}
    parts_s = sum(parts.values())
    emitted_B = np.asarray(out.stats.emitted_B)
    loop_rounds = int(np.max(np.asarray(out.stats.rounds_B)))
    row = dict(
      method=method,
      K=num_drafts,
      L=draft_len,
      efficiency=float(out.stats.block_efficiency),
      batch_efficiency=float(np.mean(emitted_B)) / loop_rounds,
      tokens_per_s=float(np.sum(np.asarray(out.lengths_B))) / t["full"],
      round_ms=1e3 * round_s,
      draft_ms=1e3 * parts["draft"],
      target_ms=1e3 * parts["target"],
      verify_ms=1e3 * parts["verify"],
      parts_ms=1e3 * parts_s,
      chained_ms=1e3 * t["chained"] / CALLS,
      round_loop_ms=1e3 * t["round loop"] / CALLS,
      round_over_parts=round_s / parts_s,
      bookkeeping=1.0 - t["chained"] / CALLS / round_s,
      predicted=predicted_speedup(float(out.stats.block_efficiency), draft_len, cost_ratio),
    )
    base = rows[0] if rows else row
    # The latency model with this machine's measured parts: tokens per round of the batch
    # (rows move in lockstep) times the autoregressive round time over the parts' sum.
    row["predicted_here"] = row["batch_efficiency"] * base["round_ms"] / row["parts_ms"]
    row["measured_here"] = row["batch_efficiency"] * base["round_ms"] / row["round_ms"]
    rows.append(row)
  return rows


def format_table(rows, baseline):
  cols = (
    ("method", "method", "{}"),
    ("K", "K", "{}"),
    ("L", "L", "{}"),
    ("efficiency", "block eff.", "{:.2f}"),
    ("batch_efficiency", "batch eff.", "{:.2f}"),
    ("tokens_per_s", "tokens/s", "{:.1f}"),
    ("round_ms", "round ms", "{:.2f}"),
    ("draft_ms", "draft ms", "{:.2f}"),
    ("target_ms", "target ms", "{:.2f}"),
    ("verify_ms", "verify ms", "{:.2f}"),
    ("parts_ms", "sum of parts ms", "{:.2f}"),
    ("chained_ms", "parts chained ms", "{:.2f}"),
    ("round_loop_ms", "round loop ms", "{:.2f}"),
    ("round_over_parts", "round / parts", "{:.2f}"),
    ("bookkeeping", "bookkeeping", "{:.0%}"),
    ("predicted_here", "speedup predicted (parts)", "{:.2f}x"),
    ("measured_here", "speedup measured", "{:.2f}x"),
    ("predicted", "predicted accel. speedup", "{:.2f}x"),
  )
  lines = ["| " + " | ".join(title for _, title, _ in cols) + " |", "|" + "---|" * len(cols)]
  for row in rows:
    lines.append("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in cols) + " |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--prompt_len", type=int, default=8)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="method:K:L,...")
  parser.add_argument("--workdir", default=str(data.default_workdir()))
  parser.add_argument("--draft_dir", help="a draft checkpoint or run directory")
  parser.add_argument("--target_dir", help="a target checkpoint or run directory")
  args = parser.parse_args()
  if (args.draft_dir is None) != (args.target_dir is None):
    parser.error("--draft_dir and --target_dir go together")
  if args.draft_dir:
    draft, target = (pairs.load_model(d) for d in (args.draft_dir, args.target_dir))
    heldout, what = None, f"loaded {args.draft_dir} / {args.target_dir}"
  else:
    draft, target, heldout, what = load_pair(pathlib.Path(args.workdir))
  prompts, lengths = bench_prompts(heldout, args.batch, args.prompt_len, target.config.vocab_size)
  configs = [(m, int(k), int(n)) for m, k, n in (c.split(":") for c in args.configs.split(","))]
  if configs[0][0] != "autoregressive":
    configs.insert(0, ("autoregressive", 1, 0))
  print(
    f"{what}: draft {count_params(draft.params):,} params, target "
    f"{count_params(target.params):,}; batch {args.batch}, {args.max_new_tokens} new tokens; "
    f"backend {jax.default_backend()}"
  )
  settings = DecodeSettings(
    num_prompts=args.batch, prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens
  )
  rows = bench(draft, target, prompts, lengths, configs, settings, args.repeats)
  print(f"load average after the run: {os.getloadavg()[0]:.2f}")
  print()
  print(format_table(rows, rows[0]))


if __name__ == "__main__":
  main()
