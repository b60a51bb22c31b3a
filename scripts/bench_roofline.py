"""The device check: each decoding program's time beside its roofline, at batch 1 and 8.

For random-weight models of bench_device.py's device size (a ~0.95B target, a ~97M draft,
V = 32k, bf16; `--small`: its tiny pair, a CPU smoke test of this script), prints per
batch size one row for each of: the autoregressive step (the engine's round), the draft
step (one token on K tails), the target call (K (L + 1) positions per row), the walk
(alone; its share of the round), and the K-SEQ K x L rounds of `--configs` (default 4 x 4
and 8 x 8; `config.DecodeSpec.parse`'s method[/drafting]:K:L[:branching], rows named by
`DecodeSpec.label`) with tails and with dedup (a scored token tree). Each row shows the
measured ms, the roofline ms, measured / roofline and the seconds its program took to
compile; each round and step also its time under the model of the compile-only report
(`scripts/program_report.py --target`, docs/ACCELERATORS.md: the round program's HBM
bytes and flops on this chip's published bandwidth and peak, plus on a GPU its kernels
times `metrics.GPU_KERNEL_S`), and measured / model, on a chip of `targets.CHIPS`.

The roofline of a program is the sum over its model calls of max(bytes read / the copy
bandwidth, FLOPs / the matmul throughput), both ceilings measured first on the device (a
copy of a 1 GiB array; a bf16 8192^3 matmul). A model call of P positions per row on B
rows reads the model's weights once and each row's cached prefix (context C = prompt +
half the new tokens), and does 2 B P (layer matmul parameters + V D) FLOPs plus 4 B P C H
Dh per layer for attention. A round is L draft calls of K positions (a tree round's
opening: one tail) and one target call (K (L + 1) positions, or a tree's N = 1 + K L
nodes); its walk is timed but has no roofline (no model call). At batch 8 a K = 8, L = 8
target call scores 576 positions and is compute-bound: a ratio to the autoregressive
step misleads there, the roofline does not.

Rounds are timed as bench_decode.py times them: (a run of the new tokens - a run stopped
after one token by a traced limit, the same program, the two timed round-robin) / the
rounds between them; where that difference is not positive (timer noise larger than the
rounds: too few new tokens or repeats) the round is marked not resolved ("-"), never a
negative time. A
program's compile seconds are its first call less a later call. The projected speedup at
batch 1 (the paper's setting) is `--block_efficiency` (default: the trained embedded
pair's in the main job's lm1b_spectr-runlocal table) x t_AR / t_round: labelled as a
projection, since random weights emit what they emit (keys: configurations as --configs
writes them).

Every row is printed as it is measured and appended to `--json` (default $OUT/roofline.json
where $OUT is set), so a run cut short keeps what it measured.

Usage: python scripts/bench_roofline.py [--small] [--batches 1,8] [--configs kseq:4:4,kseq:8:8]
         [--max_new_tokens 32] [--repeats 3] [--json PATH]
"""

import functools
import json
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from bench_device import random_pair

from spectr_jax import dryrun, engine, sharding, tables, targets, verify
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import init_params
from spectr_jax.timing import interleaved_medians, median_seconds, seconds_per_round

# The trained embedded pair's block efficiency at (method, K, L), from the main job's
# tables (docs/REPRODUCTION.md; 8 x 8: docs/RESULTS.md, "Dedup against tails").
BLOCK_EFFICIENCY = "kseq:4:4=3.25,kseq:8:8=4.02"
COLS = [
  ("batch", "B", "{}"),
  ("row", "program", "{}"),
  ("ms", "measured ms", "{:.3f}"),
  ("roofline_ms", "roofline ms", "{:.3f}"),
  ("ratio", "measured / roofline", "{:.2f}"),
  ("compile_s", "compile s", "{:.1f}"),
  ("share", "walk / round", "{:.1%}"),
  ("projected", "projected speedup (B = 1)", "{:.2f}x"),
  ("model_ms", "model ms", "{:.3f}"),
  ("measured_model", "measured / model", "{:.2f}"),
]

# The script's own flags when run; private ones when imported (tests: bench_roofline.FLAGS).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_SMALL = flags.DEFINE_bool("small", False, "Tiny models: a CPU smoke test.", flag_values=FLAGS)
_BATCHES = flags.DEFINE_string("batches", "1,8", "Batch sizes.", flag_values=FLAGS)
_CONFIGS = flags.DEFINE_string(
  "configs", "kseq:4:4,kseq:8:8", "method[/drafting]:K:L[:branching],...", flag_values=FLAGS
)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Tokens per prompt.", flag_values=FLAGS)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "max_new_tokens", 32, "Tokens generated per row.", flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats.", flag_values=FLAGS)
_BLOCK_EFFICIENCY = flags.DEFINE_string(
  "block_efficiency", BLOCK_EFFICIENCY, "config=efficiency,... of the projected speedup.",
  flag_values=FLAGS,
)  # fmt: skip
_MODEL = flags.DEFINE_bool(
  "model", True, "Also each round's time under the compile-only model (its compiles).",
  flag_values=FLAGS,
)  # fmt: skip
_JSON = flags.DEFINE_string(
  "json", os.path.join(os.environ["OUT"], "roofline.json") if "OUT" in os.environ else "",
  "Append each row as a JSON line.", flag_values=FLAGS,
)  # fmt: skip


def ceilings(small: bool, repeats: int) -> tuple[float, float]:
  """(copy bandwidth in bytes/s, bf16 matmul FLOP/s) measured on the default device."""
  n = 2**20 if small else 2**28
  x = jnp.zeros((n,), jnp.float32)
  copy = jax.jit(lambda x: jax.lax.fori_loop(0, 8, lambda _, x: x + 1.0, x))
  bandwidth = 8 * 2 * 4 * n / median_seconds(copy, x, repeats=repeats)
  m = 256 if small else 8192
  a = jax.random.normal(jax.random.key(0), (m, m), jnp.bfloat16)
  b = (jax.random.normal(jax.random.key(1), (m, m)) / np.sqrt(m)).astype(jnp.bfloat16)
  matmul = jax.jit(lambda a, b: jax.lax.fori_loop(0, 8, lambda _, a: a @ b, a))
  return bandwidth, 8 * 2 * m**3 / median_seconds(matmul, a, b, repeats=repeats)


def call_cost(bundle, rows: int, positions: int, context: int) -> tuple[float, float]:
  """(bytes read, FLOPs) of one model call of `positions` per row (module docstring)."""
  cfg = bundle.config
  leaves = jax.tree.leaves(bundle.params)
  weight_bytes = sum(x.size * x.dtype.itemsize for x in leaves)
  stacked = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
  layer_matmul = sum(x.size for x in jax.tree.leaves(stacked["layers"]) if x.ndim >= 3)
  per_position = layer_matmul + cfg.num_logits * cfg.d_model
  item = np.dtype(cfg.compute_dtype).itemsize
  cache_bytes = 2 * cfg.num_layers * rows * context * cfg.num_kv_heads * cfg.head_dim * item
  attention = 4 * context * cfg.num_heads * cfg.head_dim * cfg.num_layers
  return (
    weight_bytes + cache_bytes,
    2 * rows * positions * per_position + rows * positions * attention,
  )


def roofline_s(costs, bandwidth: float, flops: float) -> float:
  """The sum over model calls of max(bytes / bandwidth, FLOPs / throughput)."""
  return sum(max(b / bandwidth, f / flops) for b, f in costs)


def first_and_steady(fn, *args, repeats: int) -> tuple[float, float]:
  """(seconds of the first call, with its compile; median seconds of later calls)."""
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  return first, median_seconds(fn, *args, repeats=repeats)


def looped(call, calls: int = 8):
  """`calls` calls of `call(params, carry) -> carry` in one jit (parameters arguments;
  each call feeds the next, so none is hoisted)."""
  return jax.jit(lambda params, c: jax.lax.fori_loop(0, calls, lambda _, c: call(params, c), c))


def model_call_timer(bundle, rows: int, tails: int, tokens: int, context: int):
  """A looped `extend` of `tokens` on `tails` tails per row over a prefix of `context`."""
  decoder = bundle.decoder
  cache = decoder.init_cache(rows, tails, tokens, context + tokens)
  cache = cache.replace(prefix_len=jnp.full((rows,), context, jnp.int32))

  def call(params, carry):
    tokens_BxKxT, cache = carry
    logits, out = decoder.extend(params, tokens_BxKxT, cache)
    nxt = jnp.argmax(logits[..., :1, :], axis=-1).astype(jnp.int32)
    # The tails start over each call (the entries are rewritten, as in a round).
    return jnp.broadcast_to(nxt, tokens_BxKxT.shape), out.replace(tail_len=cache.tail_len)

  start = jnp.ones((rows, tails, tokens), jnp.int32)
  return looped(call), (bundle.params, (start, cache))


def walk_timer(rows: int, num_drafts: int, draft_len: int, vocab: int):
  """A looped K-SEQ walk of every row on random p and q (the round's shapes)."""
  keys = jax.random.split(jax.random.key(2), 3)
  p = jax.nn.softmax(jax.random.normal(keys[0], (rows, num_drafts, draft_len, vocab)), -1)
  q = jax.nn.softmax(jax.random.normal(keys[1], (rows, num_drafts, draft_len + 1, vocab)), -1)
  drafts = jax.random.randint(keys[2], (rows, num_drafts, draft_len), 0, vocab)
  walk = functools.partial(verify.walk, rho_value=jnp.float32(0), method="kseq", rho_mode="star")

  def call(_, carry):
    key, drafts = carry
    tokens, _, _ = jax.vmap(walk)(jax.random.split(key, rows), drafts, p, q)
    return jax.random.fold_in(key, tokens[0, 0]), drafts

  return looped(call), (None, (jax.random.key(3), drafts))


def round_ms(run, spec: DecodeSpec, repeats: int) -> tuple[float | None, float]:
  """(round ms, None where not resolved: `timing.seconds_per_round`; compile s) of the
  engine program of `spec`, `run(spec)` decoding it (module docstring). The two runs are
  timed round-robin, so a change of the machine's load moves both alike."""
  full = functools.partial(run, spec.replace(token_limit=spec.max_new_tokens))
  one = functools.partial(run, spec.replace(token_limit=1))
  start = time.perf_counter()
  out = jax.block_until_ready(full())
  first = time.perf_counter() - start
  short = one()
  medians = interleaved_medians(
    {"full": (lambda: full().tokens_BxT, ()), "one": (lambda: one().tokens_BxT, ())}, repeats
  )
  rounds = int(np.max(np.asarray(out.stats.rounds_B)) - np.max(np.asarray(short.stats.rounds_B)))
  seconds = seconds_per_round(medians["full"], medians["one"], rounds)
  return None if seconds is None else 1e3 * seconds, first - medians["full"]


def ratio(numerator: float | None, denominator: float | None) -> float | None:
  """numerator / denominator, None where either is (a round not resolved)."""
  return None if numerator is None or denominator is None else numerator / denominator


def model_ms(spec: DecodeSpec, draft, target, batch: int, prompt_len: int) -> float | None:
  """The round (or step) of `spec` under `metrics.roofline_seconds` on this device's chip
  (`spectr_jax.dryrun`: its program compiled here, its HBM bytes and flops per round, on a
  GPU its kernels), in ms; None on a device not in `targets.CHIPS` (a CPU)."""
  device = jax.devices()[0]
  chip = targets.chip_of(device)
  if chip is None or not _MODEL.value:
    return None
  target_name = f"{chip.platform}:{chip.key}"
  where = dryrun.Build(targets.Target(target_name, chip, ""), sharding.make_mesh(1, 1, [device]))
  common = dict(batch=batch, prompt_width=prompt_len)
  report = dryrun.program_report(spec, draft.config, target.config, where, **common)
  seconds = dryrun.round_report(
    spec, draft.config, target.config, where, kernels=report.kernels_per_round, **common
  ).seconds
  return 1e3 * seconds


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  start = time.perf_counter()
  small, repeats = _SMALL.value, _REPEATS.value
  prompt_len, max_new_tokens = _PROMPT_LEN.value, _MAX_NEW_TOKENS.value
  specs = [DecodeSpec.parse(c, max_new_tokens=max_new_tokens) for c in _CONFIGS.value.split(",")]
  efficiency = {
    DecodeSpec.parse(key).label(): float(value)
    for key, value in (item.split("=") for item in _BLOCK_EFFICIENCY.value.split(",") if item)
  }
  max_len = prompt_len + max_new_tokens + max(s.draft_len for s in specs) + 1
  draft, target = random_pair(small, max_len, "bfloat16")
  context = prompt_len + max_new_tokens // 2
  vocab = target.config.num_logits
  device = jax.devices()[0]
  bandwidth, flops = ceilings(small, repeats)
  print(
    f"device {device.platform} ({device.device_kind}), JAX {jax.__version__}; copy "
    f"bandwidth {bandwidth / 1e9:.0f} GB/s, bf16 matmul {flops / 1e12:.1f} TFLOP/s; context "
    f"{context} tokens, {max_new_tokens} new tokens",
    flush=True,
  )
  rows = []

  def record(row):
    rows.append(row)
    print(tables.markdown([row], COLS).splitlines()[-1], flush=True)
    if _JSON.value:
      pathlib.Path(_JSON.value).parent.mkdir(parents=True, exist_ok=True)
      with open(_JSON.value, "a") as f:
        f.write(json.dumps({**row, "bandwidth": bandwidth, "flops": flops}) + "\n")

  print(tables.markdown([], COLS), flush=True)
  for b in (int(x) for x in _BATCHES.value.split(",")):
    tokens = np.random.default_rng(0).integers(3, vocab, (b, prompt_len))
    common = dict(
      prompts=jnp.asarray(tokens, jnp.int32),
      prompt_lengths=jnp.full((b,), prompt_len, jnp.int32),
      draft=draft,
      target=target,
    )
    run = functools.partial(engine.generate, jax.random.key(0), **common)
    ar = DecodeSpec("autoregressive", max_new_tokens=max_new_tokens)
    ar_ms, compile_s = round_ms(run, ar, repeats)
    ar_roof = 1e3 * roofline_s([call_cost(target, b, 1, context)], bandwidth, flops)
    model = model_ms(ar, draft, target, b, prompt_len)
    record(dict(batch=b, row="autoregressive step", ms=ar_ms, roofline_ms=ar_roof,
                ratio=ratio(ar_ms, ar_roof), compile_s=compile_s, model_ms=model,
                measured_model=ratio(ar_ms, model)))  # fmt: skip
    for spec in specs:
      k, length, name = spec.num_drafts, spec.draft_len, spec.replace(dedup=False).label()
      draft_cost = call_cost(draft, b, k, context)
      target_cost = call_cost(target, b, k * (length + 1), context)
      tree_cost = call_cost(target, b, 1 + k * length, context)
      for part, (timer, cost) in {
        f"draft step, K = {k}": (model_call_timer(draft, b, k, 1, context), draft_cost),
        f"target call, {k * (length + 1)} positions": (
          model_call_timer(target, b, k, length + 1, context),
          target_cost,
        ),
        f"walk {name}": (walk_timer(b, k, length, vocab), None),
      }.items():
        fn, fn_args = timer
        first, steady = first_and_steady(fn, *fn_args, repeats=repeats)
        ms = 1e3 * steady / 8
        row = dict(batch=b, row=part, ms=ms, compile_s=first - steady)
        if cost is not None:
          roof = 1e3 * roofline_s([cost], bandwidth, flops)
          row.update(roofline_ms=roof, ratio=ms / roof)
        else:
          walk_ms = ms
        record(row)
      for dedup in (False, True):
        ms, compile_s = round_ms(run, spec.replace(dedup=dedup), repeats)
        opening = call_cost(draft, b, 2 if dedup else 2 * k, context)
        calls = [opening] + [draft_cost] * (length - 1) + [tree_cost if dedup else target_cost]
        roof = 1e3 * roofline_s(calls, bandwidth, flops)
        row = dict(batch=b, row=f"{name} round, {'dedup' if dedup else 'tails'}", ms=ms,
                   roofline_ms=roof, ratio=ratio(ms, roof), compile_s=compile_s,
                   share=ratio(walk_ms, ms))  # fmt: skip
        if b == 1 and name in efficiency:
          row["projected"] = ratio(efficiency[name] * ar_ms if ar_ms else None, ms)
        model = model_ms(spec.replace(dedup=dedup), draft, target, b, prompt_len)
        row.update(model_ms=model, measured_model=ratio(ms, model))
        record(row)
  print(f"\n{tables.markdown(rows, COLS)}\n")
  if any(r["ms"] is None for r in rows):
    print(f"{tables.MISSING} measured ms: a round not resolved (the run of every round was not "
          "slower than the one-round run); raise --max_new_tokens or --repeats")  # fmt: skip
  print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
  app.run(main)
