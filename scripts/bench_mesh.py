"""Decoding on (data, model) meshes: tokens/s and collectives per round, side by side.

Random-weight models of the embedded pair's sizes (draft-tiny / target-small, V = 4096)
decode the same prompts with kseq (--method, --drafting, --num_drafts and --draft_len make
its `config.DecodeSpec`) on every mesh shape of the devices (by default 8 fake
CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 is set when no
accelerator is asked for). Per shape it prints tokens/s (median of round-robin repeats,
so the machine's load moves every shape alike), the agreement of the tokens with the
data-only mesh, and the collectives the compiled program runs per round (from its HLO,
`sharding.collective_counts`: loops of known trip count, such as the draft's L steps,
multiply).

On CPU the devices are threads of one process sharing the same cores: the figures show
the overhead the collectives and the split add, not what a TPU or GPU would gain.

Usage: python scripts/bench_mesh.py [--shapes 8x1,4x2,2x4,1x8] [--num_drafts 4]
         [--draft_len 4] [--batch 16] [--max_new_tokens 32] [--repeats 3]
"""

import os
import types

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from spectr_jax import engine, sharding, tables  # noqa: E402
from spectr_jax.decode_spec import DecodeSpec  # noqa: E402
from spectr_jax.models import ModelBundle, get_model_config, init_params  # noqa: E402
from spectr_jax.timing import interleaved_medians  # noqa: E402

# The script's own flags when run; private ones when imported.
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_FLAGS = [
  flags.DEFINE_string("shapes", "8x1,4x2,2x4,1x8", "Mesh shapes data x model.", flag_values=FLAGS),
  flags.DEFINE_string("method", "kseq", "The verifier.", flag_values=FLAGS),
  flags.DEFINE_string(
    "drafting", "", "Its drafting scheme ('' for the method's own).", flag_values=FLAGS
  ),
  flags.DEFINE_integer("num_drafts", 4, "K.", flag_values=FLAGS),
  flags.DEFINE_integer("draft_len", 4, "L.", flag_values=FLAGS),
  flags.DEFINE_integer("batch", 16, "Rows.", flag_values=FLAGS),
  flags.DEFINE_integer("max_new_tokens", 32, "Tokens generated per row.", flag_values=FLAGS),
  flags.DEFINE_integer("vocab", 4096, "Vocabulary size.", flag_values=FLAGS),
  flags.DEFINE_string("draft", "draft-tiny", "The draft's model config.", flag_values=FLAGS),
  flags.DEFINE_string("target", "target-small", "The target's model config.", flag_values=FLAGS),
  flags.DEFINE_integer("repeats", 3, "Timed repeats.", flag_values=FLAGS),
]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = types.SimpleNamespace(**{holder.name: holder.value for holder in _FLAGS})
  spec = DecodeSpec(
    method=args.method, num_drafts=args.num_drafts, draft_len=args.draft_len,
    drafting=args.drafting, max_new_tokens=args.max_new_tokens,
  )  # fmt: skip
  shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
  bundles = []
  for seed, name in enumerate((args.draft, args.target), start=1):
    config = get_model_config(name, args.vocab)
    bundles.append(ModelBundle(config, init_params(config, jax.random.key(seed))))
  draft, target = bundles
  rng = np.random.default_rng(0)
  kw = dict(
    draft=draft,
    target=target,
    prompts=rng.integers(0, args.vocab, (args.batch, 8)).astype(np.int32),
    prompt_lengths=np.full(args.batch, 8),
  )
  key = jax.random.key(0)
  print(
    f"{jax.device_count()} {jax.devices()[0].platform} devices; {spec.label()}, batch "
    f"{args.batch} x {args.max_new_tokens} tokens; target "
    f"{args.target} (H={target.config.num_heads}, Hk={target.config.num_kv_heads}, "
    f"F={target.config.mlp_dim}, V={args.vocab})"
  )
  meshes = {f"{d}x{m}": sharding.make_mesh(d, m) for d, m in shapes}
  timers = {
    name: (lambda mesh=mesh: engine.generate(key, spec, mesh=mesh, **kw), ())
    for name, mesh in meshes.items()
  }
  seconds = interleaved_medians(timers, repeats=args.repeats)
  first = engine.generate(key, spec, mesh=next(iter(meshes.values())), **kw)
  rows = []
  for name, mesh in meshes.items():
    out = engine.generate(key, spec, mesh=mesh, **kw)
    lowered = engine.lower(key, spec, mesh=mesh, **kw)
    counts = sharding.collective_counts(lowered.compile().as_text())
    per_round = counts["per_iteration"]
    rows.append(
      dict(
        mesh=name,
        tok_s=args.batch * args.max_new_tokens / seconds[name],
        agree=float(np.mean(np.asarray(out.tokens_BxT) == np.asarray(first.tokens_BxT))),
        rounds=float(np.mean(np.asarray(out.stats.rounds_B))),
        all_reduce=per_round["all-reduce"],
        all_gather=per_round["all-gather"],
        other=sum(per_round.values()) - per_round["all-reduce"] - per_round["all-gather"],
        once=sum(counts["once"].values()),
      )
    )
  cols = [
    ("mesh", "mesh (data x model)", "{}"),
    ("tok_s", "tokens/s", "{:.0f}"),
    ("agree", f"tokens = {next(iter(meshes))}", "{:.3f}"),
    ("rounds", "rounds / row", "{:.1f}"),
    ("all_reduce", "all-reduce / round", "{}"),
    ("all_gather", "all-gather / round", "{}"),
    ("other", "other collectives / round", "{}"),
    ("once", "collectives outside rounds", "{}"),
  ]
  print(tables.markdown(rows, cols))


if __name__ == "__main__":
  app.run(main)
