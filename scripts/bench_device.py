"""The accelerator benchmark: the cost split of a round and the latency-model check.

Runs `bench_decode.bench` (one row per (method, K, L): block efficiency, one engine
round beside its separately timed draft, target and verify parts, the round predicted by
the cost table measured in the same run beside the measured one; the table is printed)
on the default device, with random-weight PaLM-style models at the paper's size ratio (a
~1B target, a ~100M draft, bf16 activations and caches) or a loaded pair of runs
(`--draft`, `--target`). Random weights make the block efficiency meaningless (the
models disagree); the cost split and the latency-model check do not depend on it. Eight
configurations by default.

Compiling dominates on a GPU: on an H200 (docs/PERFORMANCE.md, "On an accelerator") the
autoregressive and K-SEQ 8 x 8 rows took about 4 minutes with their compiles, and a tree
comparison's programs (the target's layers once per compiled node count) take over 5
minutes per config, so split a run into calls of 10 minutes: `--configs ""` skips the
decoding table, `--tree_configs ""` the comparison.

Then the rounds of `--tree_configs` (default kseq:8:8; "" skips them) as K tails and as
token trees, side by side (`bench_tree.compare`: target positions, target call and round
times, block efficiency). With `--budget_configs` (e.g. "kseq:8:4,rrs:8:4:4-2-1-1,
rrs:8:4:proportional"), also the node-budget table of `bench_tree.py --budgets` on the
same prompts (meaningful with a loaded pair: random weights disagree).

Usage: python scripts/bench_device.py [--small] [--draft RUN --target RUN]
         [--configs autoregressive:1:0,sd:1:4,...] [--tree_configs kseq:8:8] [--batch 8]
         [--max_new_tokens 64] [--budget_configs ... --budgets 16,32,64]
`--small` uses tiny models (a CPU smoke test of the script).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from bench_decode import bench, format_costs, format_table
from bench_tree import BUDGET_COLS, budget_rows, compare, format_rows, parse_configs

from spectr_jax import pairs
from spectr_jax.config import DecodeSettings
from spectr_jax.models import ModelBundle, ModelConfig, count_params, init_params

CONFIGS = "autoregressive:1:0,sd:1:4,kseq:4:4,kseq:8:4,kseq:8:8,optimal:8:4,gbv:4:4,gbv:8:4"
VOCAB = 32_000
# ~0.95B and ~97M parameters at V = 32k (the paper pairs a large target with a draft
# about a tenth of its size).
TARGET = dict(d_model=2048, num_layers=20, num_heads=16, num_kv_heads=2, head_dim=128, mlp_dim=5632)
DRAFT = dict(d_model=768, num_layers=12, num_heads=12, num_kv_heads=1, head_dim=64, mlp_dim=2048)
SMALL_VOCAB = 512
SMALL_TARGET = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128)
SMALL_DRAFT = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64)


def random_pair(small: bool, max_len: int, dtype: str) -> tuple[ModelBundle, ModelBundle]:
  """Random-weight draft and target models (see the module docstring), as a decode holds
  them (`ModelBundle.for_decoding`)."""
  vocab, sizes = (SMALL_VOCAB, (SMALL_DRAFT, SMALL_TARGET)) if small else (VOCAB, (DRAFT, TARGET))
  bundles = []
  for seed, size in enumerate(sizes):
    config = ModelConfig(vocab_size=vocab, max_len=max_len, dtype=dtype, **size)
    params = init_params(config, jax.random.key(seed))
    bundles.append(ModelBundle(config, params).for_decoding())
  return bundles[0], bundles[1]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--small", action="store_true", help="tiny models: a CPU smoke test")
  parser.add_argument(
    "--draft", help="a draft run or Hugging Face checkpoint directory (with --target)"
  )
  parser.add_argument(
    "--target", help="a target run or Hugging Face checkpoint directory (with --draft)"
  )
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--prompt_len", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--configs", default=CONFIGS, help='method:K:L,... ("" skips them)')
  parser.add_argument(
    "--tree_configs",
    default="kseq:8:8",
    help="method:K:L[:b1-b2-...],... timed as tails and as trees",
  )
  parser.add_argument("--budget_configs", default="", help="method:K:L[:shape],... by budget")
  parser.add_argument("--budgets", default="16,32,64")
  args = parser.parse_args()
  start = time.perf_counter()
  if args.small:
    args.batch, args.max_new_tokens, args.repeats = min(args.batch, 2), 16, 3
  max_len = args.prompt_len + args.max_new_tokens + 9
  if (args.draft is None) != (args.target is None):
    parser.error("--draft and --target go together")
  if args.draft is not None:
    draft, target = (pairs.load_model(d, args.dtype) for d in (args.draft, args.target))
    what = f"loaded {args.draft} / {args.target}"
  else:
    draft, target = random_pair(args.small, max_len, args.dtype)
    what = "random weights" + (" (small)" if args.small else "")
  vocab = target.config.num_logits
  tokens = np.random.default_rng(0).integers(3, vocab, (args.batch, args.prompt_len))
  prompts = jnp.asarray(tokens, jnp.int32)
  lengths = jnp.full((args.batch,), args.prompt_len, jnp.int32)
  device = jax.devices()[0]
  print(
    f"{what}: draft {count_params(draft.params):,} params, target "
    f"{count_params(target.params):,}, {target.config.dtype}; batch {args.batch}, "
    f"{args.max_new_tokens} new tokens; device {device.platform} ({device.device_kind})"
  )
  settings = DecodeSettings(
    num_prompts=args.batch,
    prompt_len=args.prompt_len,
    max_new_tokens=args.max_new_tokens,
    stop_at_eos=False,
  )
  if args.configs:
    configs = [(m, int(k), int(n)) for m, k, n in (c.split(":") for c in args.configs.split(","))]
    if configs[0][0] != "autoregressive":
      configs.insert(0, ("autoregressive", 1, 0))
    rows, costs = bench(draft, target, prompts, lengths, configs, settings, args.repeats)
    print(f"\n{format_costs(costs)}\n")
    print(format_table(rows))
  if args.tree_configs:
    tree_configs = parse_configs(args.tree_configs)
    batch = (prompts, lengths)
    tree_rows = compare(
      draft, target, batch, batch, tree_configs, args.max_new_tokens, args.repeats
    )
    print("\nTails against token trees (scripts/bench_tree.py):\n")
    print(format_rows(tree_rows))
  if args.budget_configs:
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = budget_rows(
      draft, target, (prompts, lengths), parse_configs(args.budget_configs),
      args.max_new_tokens, budgets,
    )  # fmt: skip
    print("\nTrees at equal node budgets (scripts/bench_tree.py --budgets):\n")
    print(format_rows(rows, BUDGET_COLS))
  print(f"\ntotal {time.perf_counter() - start:.0f} s (compile and run)")


if __name__ == "__main__":
  main()
