"""The accelerator benchmark: the cost split of a round and the latency-model check.

Runs `bench_decode.bench` (one row per (method, K, L): block efficiency, one engine
round beside its separately timed draft, target and verify parts, the round predicted by
the cost table measured in the same run beside the measured one; the table is printed)
on the default device, with random-weight PaLM-style models at the paper's size ratio (a
~1B target, a ~100M draft, bf16 activations and caches) or a loaded pair of runs
(`--draft`, `--target`). Random weights make the block efficiency meaningless (the
models disagree); the cost split and the latency-model check do not depend on it. Eight
configurations by default.

Compiling dominates on a GPU: on an H200 (docs/RESULTS.md, "On an accelerator: one H200") the
autoregressive and K-SEQ 8 x 8 rows took about 4 minutes with their compiles, and a tree
comparison's programs (the target's layers once per compiled node count) take over 5
minutes per config, so split a run into calls of 10 minutes: `--configs ""` skips the
decoding table, `--tree_configs ""` the comparison.

Then the rounds of `--tree_configs` (default kseq:8:8; "" skips them) as K tails and with
dedup (their token trees), side by side (`bench_tree.compare`: target positions, target
call and round times, block efficiency). With `--budget_configs` (e.g.
"kseq:8:4,rrs:8:4:4x2x1x1,rrs:8:4:proportional"), also the node-budget table of
`bench_tree.py --budgets` on the same prompts (meaningful with a loaded pair: random
weights disagree). Every configuration is `config.DecodeSpec.parse`'s
method[/drafting]:K:L[:branching].

Usage: python scripts/bench_device.py [--small] [--draft RUN --target RUN]
         [--configs autoregressive:1:0,sd:1:4,...] [--tree_configs kseq:8:8] [--batch 8]
         [--max_new_tokens 64] [--budget_configs ... --budgets 16,32,64]
`--small` uses tiny models (a CPU smoke test of the script).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from bench_decode import bench, format_costs, format_table, parse_specs
from bench_tree import BUDGET_COLS, budget_rows, compare, format_rows, parse_configs

from spectr_jax import pairs
from spectr_jax.decode_spec import DecodeSpec
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

# The script's own flags when run; private ones when imported (bench_decode.FLAGS).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_SMALL = flags.DEFINE_bool("small", False, "Tiny models: a CPU smoke test.", flag_values=FLAGS)
_DRAFT = flags.DEFINE_string(
  "draft", None, "A draft run or Hugging Face checkpoint directory (with --target).",
  flag_values=FLAGS,
)  # fmt: skip
_TARGET = flags.DEFINE_string(
  "target", None, "A target run or Hugging Face checkpoint directory (with --draft).",
  flag_values=FLAGS,
)  # fmt: skip
_BATCH = flags.DEFINE_integer("batch", 8, "Prompts (rows) per call.", flag_values=FLAGS)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Tokens per prompt.", flag_values=FLAGS)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "max_new_tokens", 64, "Tokens generated per row.", flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per timer.", flag_values=FLAGS)
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "The models' compute dtype.", flag_values=FLAGS)
_CONFIGS = flags.DEFINE_string(
  "configs", CONFIGS, 'method[/drafting]:K:L[:branching],... ("" skips them)', flag_values=FLAGS
)
_TREE_CONFIGS = flags.DEFINE_string(
  "tree_configs", "kseq:8:8", "method[/drafting]:K:L[:branching],... timed as tails and dedup",
  flag_values=FLAGS,
)  # fmt: skip
_BUDGET_CONFIGS = flags.DEFINE_string(
  "budget_configs", "", "method[/drafting]:K:L[:branching],... by budget", flag_values=FLAGS
)
_BUDGETS = flags.DEFINE_string("budgets", "16,32,64", "Node budgets.", flag_values=FLAGS)


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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  start = time.perf_counter()
  small, batch, prompt_len = _SMALL.value, _BATCH.value, _PROMPT_LEN.value
  max_new_tokens, repeats = _MAX_NEW_TOKENS.value, _REPEATS.value
  if small:
    batch, max_new_tokens, repeats = min(batch, 2), 16, 3
  max_len = prompt_len + max_new_tokens + 9
  if (_DRAFT.value is None) != (_TARGET.value is None):
    raise app.UsageError("--draft and --target go together")
  if _DRAFT.value is not None:
    draft, target = (pairs.load_model(d, _DTYPE.value) for d in (_DRAFT.value, _TARGET.value))
    what = f"loaded {_DRAFT.value} / {_TARGET.value}"
  else:
    draft, target = random_pair(small, max_len, _DTYPE.value)
    what = "random weights" + (" (small)" if small else "")
  vocab = target.config.num_logits
  tokens = np.random.default_rng(0).integers(3, vocab, (batch, prompt_len))
  prompts = jnp.asarray(tokens, jnp.int32)
  lengths = jnp.full((batch,), prompt_len, jnp.int32)
  device = jax.devices()[0]
  print(
    f"{what}: draft {count_params(draft.params):,} params, target "
    f"{count_params(target.params):,}, {target.config.dtype}; batch {batch}, "
    f"{max_new_tokens} new tokens; device {device.platform} ({device.device_kind})"
  )
  if _CONFIGS.value:
    specs = parse_specs(_CONFIGS.value, max_new_tokens=max_new_tokens)
    if specs[0].method != "autoregressive":
      specs.insert(0, DecodeSpec("autoregressive", max_new_tokens=max_new_tokens))
    rows, costs = bench(draft, target, prompts, lengths, specs, repeats)
    print(f"\n{format_costs(costs)}\n")
    print(format_table(rows))
  if _TREE_CONFIGS.value:
    tree_specs = parse_configs(_TREE_CONFIGS.value, max_new_tokens=max_new_tokens)
    both = (prompts, lengths)
    tree_rows = compare(draft, target, both, both, tree_specs, repeats)
    print("\nTails against dedup, their token trees (scripts/bench_tree.py):\n")
    print(format_rows(tree_rows))
  if _BUDGET_CONFIGS.value:
    budgets = [int(b) for b in _BUDGETS.value.split(",")]
    budget_specs = parse_configs(_BUDGET_CONFIGS.value, max_new_tokens=max_new_tokens)
    rows = budget_rows(draft, target, (prompts, lengths), budget_specs, budgets)
    print("\nTrees at equal node budgets (scripts/bench_tree.py --budgets):\n")
    print(format_rows(rows, BUDGET_COLS))
  print(f"\ntotal {time.perf_counter() - start:.0f} s (compile and run)")


if __name__ == "__main__":
  app.run(main)
