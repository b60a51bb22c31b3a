"""The program report: what the engine's decoding programs hold, lowered and compiled on CPU.

For a model pair (default: bench_device.py's device-size pair, a ~0.95B target and a ~97M
draft at V = 32k, bf16 compute; `--small`: its tiny pair) with abstract parameters (shapes
only, `jax.eval_shape` of `init_params`: nothing is allocated), lowers `engine.lower` and
compiles on CPU the programs of the autoregressive decode ("ar"), a K-SEQ K x L decode
with K tails ("tails") and the same decode with dedup, scoring its token tree ("dedup";
"tree" is taken too) (default K = L = 8, batch 8, prompt width 16, 64 new tokens; the
method and drafting scheme of --method and --drafting), and prints one markdown row per
program, named by `DecodeSpec.label`:

  params: the bytes by dtype of the target's and the draft's parameter arguments (as the
    program takes them: after any cast or re-layout the engine applies on the way in);
  param converts: `convert` instructions in the pre-optimisation HLO that turn a float32
    tensor of a parameter's shape into a narrower float (weight-sized casts), and how
    many of them sit inside the loop of rounds (`programs.round_loop`);
  loops: while loops of the lowered and of the compiled module; of the compiled ones,
    those with a known trip count (fixed) and without (data-dependent); conditionals
    (all data-dependent). A list below the table names each data-dependent one by its
    op_name (the jit / named-scope path: which piece of the round owns it);
  ops: instructions of the lowered module, instructions of the compiled module (fused
    computations included) and its kernels (`programs.count_kernels`), and matmuls
    (dot / convolution) of the compiled module;
  compile s: seconds of `lowered.compile()` on the CPU, wall clock and, in parentheses,
    the process's CPU time (steadier on a shared machine); lower s: of `engine.lower`.

Then the same counts per layer: the difference between the K-SEQ tails program with a
2-layer and with a 1-layer target (the draft at 1 layer), and likewise for the draft,
with the layers unrolled where the engine could scan them (`layer_stack="unroll"`). A
per-layer count covers every place the program runs the model (prefill, draft steps,
the target call, commit).

Usage: python scripts/program_report.py [--small] [--batch 8] [--programs ar,tails,dedup]
         [--method kseq] [--drafting iid] [--num_drafts 8] [--draft_len 8]
         [--per_layer tails] [--scan_layers default] [--json PATH]
"""

import dataclasses
import json
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from bench_device import DRAFT, SMALL_DRAFT, SMALL_TARGET, SMALL_VOCAB, TARGET, VOCAB

from spectr_jax import dryrun, engine, metrics, programs, tables, targets
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import HeadConfig, ModelBundle, ModelConfig, count_params, init_params

PROGRAMS = ("ar", "tails", "dedup")
# On a target: the decode programs of --method at K x L (tails, tree, adaptive), the
# node budget (rrs on its tree), and the other verifiers' tails (traversal: its tree).
TARGET_PROGRAMS = ("ar", "tails", "tree", "adaptive", "budget", "optimal", "gbv", "rrs",
                   "traversal")  # fmt: skip
ALIASES = {"tree": "dedup"}  # the name before DecodeSpec.dedup
# --scan_layers -> DecodeSpec.layer_stack
LAYER_STACKS = {"default": "auto", "on": "scan", "off": "unroll"}

# The script's own flags when run; private ones when imported (bench_device.FLAGS).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_FLAGS = [
  flags.DEFINE_bool("small", False, "bench_device's tiny pair.", flag_values=FLAGS),
  flags.DEFINE_integer("batch", 8, "Rows.", flag_values=FLAGS),
  flags.DEFINE_integer("prompt_len", 16, "Prompt width.", flag_values=FLAGS),
  flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per row.", flag_values=FLAGS),
  flags.DEFINE_string("dtype", "bfloat16", "The models' compute dtype.", flag_values=FLAGS),
  flags.DEFINE_string("method", "kseq", "The method of tails and dedup.", flag_values=FLAGS),
  flags.DEFINE_string(
    "drafting", "", "Its drafting scheme ('' for the method's own).", flag_values=FLAGS
  ),
  flags.DEFINE_integer("num_drafts", 8, "K.", flag_values=FLAGS),
  flags.DEFINE_integer(
    "head_layers",
    0,
    "Draft with a head of the target of this many blocks (0: the draft).",
    flag_values=FLAGS,
  ),
  flags.DEFINE_integer("draft_len", 8, "L.", flag_values=FLAGS),
  flags.DEFINE_string(
    "programs", ",".join(PROGRAMS), "A subset of ar,tails,dedup.", flag_values=FLAGS
  ),
  flags.DEFINE_string(
    "per_layer",
    "tails",
    'The program counted per layer (ar, tails, dedup; "" skips).',
    flag_values=FLAGS,
  ),  # fmt: skip
  flags.DEFINE_enum(
    "scan_layers",
    "default",
    list(LAYER_STACKS),
    "The programs' layers scanned (on), unrolled (off) or as the engine picks (default).",
    flag_values=FLAGS,
  ),  # fmt: skip
  flags.DEFINE_string("json", None, "Also write the numbers to this JSON file.", flag_values=FLAGS),
  flags.DEFINE_string(
    "target",
    "",
    "Compile-only targets (spectr_jax.targets), e.g. tpu:v5e:2x2,gpu:h100: "
    "the accelerator tables instead of the CPU one.",
    flag_values=FLAGS,
  ),  # fmt: skip
  flags.DEFINE_integer("model", 1, "Devices per 'model' group on a target.", flag_values=FLAGS),
  flags.DEFINE_string(
    "target_programs",
    ",".join(TARGET_PROGRAMS),
    "The programs compiled for a target: a subset of " + ",".join(TARGET_PROGRAMS) + ".",
    flag_values=FLAGS,
  ),  # fmt: skip
  flags.DEFINE_string("batches", "1,8", "Batch sizes on a target.", flag_values=FLAGS),
  flags.DEFINE_string(
    "rounds",
    "ar,kseq:4:4,kseq:8:8",
    "Rounds to project on a target (ar or method:K:L, each as tails and tree); '' skips.",
    flag_values=FLAGS,
  ),  # fmt: skip
  flags.DEFINE_string(
    "block_efficiency",
    "kseq:4:4=3.25,kseq:8:8=4.02",
    "config=efficiency,... of the "
    "projected speedup (the trained embedded pair's: docs/RESULTS.md).",
    flag_values=FLAGS,
  ),  # fmt: skip
]
_DTYPE_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}


def abstract_bundle(config: ModelConfig) -> ModelBundle:
  """A bundle of `config` as decoding loads it (`ModelBundle.for_decoding`: weights in
  the compute dtype, the decoder's layout) whose parameters are `jax.ShapeDtypeStruct`s:
  nothing allocated. The params column reports what the program takes."""

  def build():
    return ModelBundle(config, init_params(config, jax.random.key(0))).for_decoding()

  return jax.eval_shape(build)


def pair_configs(args) -> tuple[ModelConfig, ModelConfig]:
  """The (draft, target) configs of the report (bench_device's pair; with
  --head_layers, the draft is a head of the target: `models.head`)."""
  vocab, sizes = (
    (SMALL_VOCAB, (SMALL_DRAFT, SMALL_TARGET)) if args.small else (VOCAB, (DRAFT, TARGET))
  )
  max_len = args.prompt_len + args.max_new_tokens + args.draft_len + 1
  draft, target = (
    ModelConfig(vocab_size=vocab, max_len=max_len, dtype=args.dtype, **size) for size in sizes
  )
  if args.head_layers:
    draft = HeadConfig.of(target, args.head_layers)
  return draft, target


def program_spec(name: str, args, layer_stack: str = "auto") -> DecodeSpec:
  """The `DecodeSpec` of program `name` ("ar", "tails" or "dedup")."""
  name = ALIASES.get(name, name)
  common = dict(max_new_tokens=args.max_new_tokens, layer_stack=layer_stack)
  if name == "ar":
    return DecodeSpec("autoregressive", **common)
  return DecodeSpec(
    method=args.method, num_drafts=args.num_drafts, draft_len=args.draft_len,
    drafting=args.drafting, dedup=name == "dedup", **common,
  )  # fmt: skip


def program_kwargs(name: str, args, draft: ModelBundle, target: ModelBundle) -> dict:
  """The `engine.lower` keyword arguments of program `name` (its spec aside)."""
  return dict(
    draft=None if ALIASES.get(name, name) == "ar" else draft,
    target=target,
    prompts=jnp.ones((args.batch, args.prompt_len), jnp.int32),
    prompt_lengths=jnp.full((args.batch,), args.prompt_len, jnp.int32),
  )


def label(name: str, args) -> str:
  """A program's row label: its spec's (`DecodeSpec.label`), "tails" marked."""
  spec = program_spec(name, args)
  return spec.label() + (" tails" if spec.speculative and not spec.dedup else "")


def bytes_by_dtype(tree) -> dict[str, int]:
  """Bytes of the array leaves of `tree` (anything with shape and dtype), by dtype name."""
  totals = {}
  for leaf in jax.tree.leaves(tree):
    dtype = np.dtype(leaf.dtype)
    totals[dtype.name] = totals.get(dtype.name, 0) + int(np.prod(leaf.shape)) * dtype.itemsize
  return totals


def program_params(lowered, bundle: ModelBundle | None):
  """The parameter argument of the lowered program that holds `bundle`'s parameters: the
  positional argument with as many scalars (the engine may change their dtype or layout
  on the way in), or the bundle's parameters when none has (None without a bundle)."""
  if bundle is None:
    return None
  want = count_params(bundle.params)
  for arg in lowered.args_info[0]:
    if jax.tree.leaves(arg) and count_params(arg) == want:
      return arg
  return bundle.params


def measure(
  name: str, args, draft: ModelBundle, target: ModelBundle, layer_stack: str = "auto"
) -> dict:
  """Lowers and compiles one program; returns its counts (see the module docstring)."""
  spec = program_spec(name, args, layer_stack)
  kwargs = program_kwargs(name, args, draft, target)
  start = time.perf_counter()
  lowered = engine.lower(jax.random.key(0), spec, **kwargs)
  lower_s = time.perf_counter() - start
  lowered_text = lowered.as_text(dialect="hlo", debug_info=True)
  start, cpu_start = time.perf_counter(), time.process_time()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  compile_cpu_s = time.process_time() - cpu_start
  low, comp = programs.parse(lowered_text), programs.parse(compiled.as_text())

  params = {"target": program_params(lowered, target), "draft": None}
  if kwargs["draft"] is not None:
    params["draft"] = program_params(lowered, draft)
  shapes = {
    tuple(x.shape)
    for tree in params.values()
    if tree is not None
    for x in jax.tree.leaves(tree)
    if np.dtype(x.dtype) == np.float32
  }
  converts = programs.parameter_converts(low, shapes)
  compiled_converts = programs.parameter_converts(comp, shapes)
  flow = programs.control_flow(comp)
  lowered_flow = programs.control_flow(low)
  loop, _ = programs.round_loop(comp)
  return {
    "program": label(name, args),
    "params": {k: bytes_by_dtype(v) if v is not None else {} for k, v in params.items()},
    "param_converts": len(converts),
    "param_converts_in_round_loop": sum(inside for _, inside in converts),
    "param_converts_by_scope": programs.scope_counts(i for i, _ in converts),
    "param_converts_compiled": len(compiled_converts),
    "whiles_lowered": sum(c.kind == "while" for c in lowered_flow),
    "conditionals_lowered": sum(c.kind == "conditional" for c in lowered_flow),
    "whiles": sum(c.kind == "while" for c in flow),
    "whiles_fixed": sum(c.kind == "while" and not c.data_dependent for c in flow),
    "whiles_data_dependent": sum(c.kind == "while" and c.data_dependent for c in flow),
    "conditionals": sum(c.kind == "conditional" for c in flow),
    "round_loop": loop.op_name if loop is not None else None,
    "data_dependent": [
      {"kind": c.kind, "name": c.name, "op_name": c.op_name, "in_round_loop": c.in_round_loop}
      for c in flow
      if c.data_dependent
    ],
    "fixed": [
      {"name": c.name, "op_name": c.op_name, "trip_count": c.trip_count}
      for c in flow
      if not c.data_dependent
    ],
    "instructions_lowered": programs.count_instructions(low),
    "matmuls_lowered": programs.count_matmuls(low),
    "instructions_compiled": programs.count_instructions(comp),
    "kernels_compiled": programs.count_kernels(comp),
    "matmuls_compiled": programs.count_matmuls(comp),
    "lower_s": lower_s,
    "compile_s": compile_s,
    "compile_cpu_s": compile_cpu_s,
  }


def per_layer(name: str, args, draft_config: ModelConfig, target_config: ModelConfig) -> dict:
  """Counts per layer of the target and of the draft: program `name` with that model at
  2 layers minus at 1 layer (the other model at 1 layer), layers unrolled (an engine
  that can scan them is told not to: a scanned layer is one body at any depth)."""
  keys = (
    "instructions_lowered",
    "instructions_compiled",
    "kernels_compiled",
    "matmuls_lowered",
    "matmuls_compiled",
    "param_converts",
  )

  def run(draft_layers: int, target_layers: int) -> dict:
    draft = abstract_bundle(dataclasses.replace(draft_config, num_layers=draft_layers))
    target = abstract_bundle(dataclasses.replace(target_config, num_layers=target_layers))
    return measure(name, args, draft, target, layer_stack="unroll")

  base = run(1, 1)
  grown = {"target": run(1, 2)} | ({} if ALIASES.get(name, name) == "ar" else {"draft": run(2, 1)})
  rows = {model: {k: r[k] - base[k] for k in keys} for model, r in grown.items()}
  seconds = base["compile_s"] + sum(r["compile_s"] for r in grown.values())
  return {"program": label(name, args), "per_layer": rows, "compile_s": seconds}


def format_bytes(totals: dict[str, int]) -> str:
  """e.g. "f32 3.79 GB" ("-" when empty)."""
  if not totals:
    return "-"
  return ", ".join(
    f"{_DTYPE_NAMES.get(k, k)} " + (f"{v / 1e9:.2f} GB" if v >= 1e7 else f"{v / 1e6:.2f} MB")
    for k, v in sorted(totals.items())
  )


TABLE_COLS = [
  ("program", "program", "{}"),
  ("target_params", "target params", "{}"),
  ("draft_params", "draft params", "{}"),
  ("converts", "param converts (in round loop)", "{}"),
  ("whiles", "whiles lowered / compiled (fixed + data-dep.)", "{}"),
  ("conditionals", "conditionals", "{}"),
  ("instructions_lowered", "instructions lowered", "{}"),
  ("instructions", "instructions compiled (kernels)", "{}"),
  ("matmuls_compiled", "matmuls compiled", "{}"),
  ("lower_s", "lower s", "{:.1f}"),
  ("compile", "compile s (CPU s)", "{}"),
]
PER_LAYER_COLS = [
  ("model", "model", "{}"),
  ("instructions_lowered", "instructions lowered", "{}"),
  ("instructions_compiled", "instructions compiled", "{}"),
  ("kernels_compiled", "kernels compiled", "{}"),
  ("matmuls_lowered", "matmuls lowered", "{}"),
  ("matmuls_compiled", "matmuls compiled", "{}"),
  ("param_converts", "param converts", "{}"),
]


def format_table(rows: list[dict]) -> str:
  """The markdown table of the programs, then their data-dependent loops and
  conditionals."""
  cells = [
    dict(
      r,
      target_params=format_bytes(r["params"]["target"]),
      draft_params=format_bytes(r["params"]["draft"]),
      converts=f"{r['param_converts']} ({r['param_converts_in_round_loop']})",
      whiles=f"{r['whiles_lowered']} / {r['whiles']} ({r['whiles_fixed']} + "
      f"{r['whiles_data_dependent']})",
      instructions=f"{r['instructions_compiled']} ({r['kernels_compiled']})",
      compile=f"{r['compile_s']:.1f} ({r['compile_cpu_s']:.1f})",
    )
    for r in rows
  ]
  lines = [tables.markdown(cells, TABLE_COLS)]
  for r in rows:
    lines += ["", f"Data-dependent loops and conditionals of {r['program']} (compiled):"]
    for c in r["data_dependent"]:
      where = "" if c["in_round_loop"] else " (outside the loop of rounds)"
      lines.append(f"- {c['kind']} {c['name']}: `{c['op_name'] or '(no metadata)'}`{where}")
    scopes = ", ".join(f"{k}: {v}" for k, v in r["param_converts_by_scope"].items())
    lines.append(f"Param converts by scope: {scopes or 'none'}")
  return "\n".join(lines)


def format_per_layer(result: dict) -> str:
  """The markdown table of counts per layer."""
  lines = [
    f"Per layer ({result['program']} program, the model at 2 layers minus at 1 layer; "
    f"{result['compile_s']:.0f} s of compiles):",
    "",
    tables.markdown(
      [dict(d, model=model) for model, d in result["per_layer"].items()], PER_LAYER_COLS
    ),
  ]
  if any(d["matmuls_lowered"] <= 0 for d in result["per_layer"].values()):
    lines.append(
      "\nNote: the lowered matmuls do not grow with the depth: the layers ran under a scan "
      "(one body at any depth), so these differences are not per layer."
    )
  return "\n".join(lines)


def target_spec(name: str, args) -> DecodeSpec:
  """The `DecodeSpec` of target program `name` (`TARGET_PROGRAMS`)."""
  k, length, common = args.num_drafts, args.draft_len, dict(max_new_tokens=args.max_new_tokens)
  if name == "ar":
    return DecodeSpec("autoregressive", **common)
  if name in ("tails", "tree", "adaptive"):
    return DecodeSpec(args.method, k, length, drafting=args.drafting, dedup=name == "tree",
                      adaptive=0.5 if name == "adaptive" else 0.0, **common)  # fmt: skip
  if name == "budget":
    return DecodeSpec("rrs", k, length, dedup=True, node_budget=k * length // 2, **common)
  return DecodeSpec(name, k, length, dedup=name == "traversal", **common)


ROUND_COLS = [
  ("target", "target", "{}"),
  ("program", "round", "{}"),
  ("batch", "B", "{}"),
  ("gflops", "GFLOP", "{:.1f}"),
  ("hbm", "HBM GB", "{:.3f}"),
  ("must_move", "must move GB", "{:.3f}"),
  ("ratio", "HBM / must move", "{:.2f}"),
  ("compiler", "compiler's bytes GB", "{}"),
  ("kernels", "kernels", "{}"),
  ("ms", "projected ms", "{:.3f}"),
  ("speedup", "projected speedup", "{}"),
  ("compile_s", "compile s", "{:.1f}"),
]


def _gb(value: float) -> str:
  return f"{value / 1e9:.2f}"


def target_main(args) -> dict:
  """The accelerator tables: each target's programs, rounds and projected speedups."""
  draft_config, target_config = pair_configs(args)
  batches = [int(b) for b in args.batches.split(",") if b]
  efficiency = {
    DecodeSpec.parse(key).label(): float(value)
    for key, value in (item.split("=") for item in args.block_efficiency.split(",") if item)
  }
  common = dict(prompt_width=args.prompt_len)
  program_rows, round_rows = [], []
  for name in args.target.split(","):
    where = dryrun.build(name, args.model)
    for b in batches:
      for program in args.target_programs.split(","):
        spec = target_spec(program, args)
        report = dryrun.program_report(spec, draft_config, target_config, where, batch=b, **common)
        program_rows.append(dryrun.report_row(report))
        print(tables.markdown([program_rows[-1]], dryrun.REPORT_COLS).splitlines()[-1], flush=True)
      ar_ms = None
      for text in (t for t in args.rounds.split(",") if t):
        if text == "ar":
          specs = [DecodeSpec("autoregressive", max_new_tokens=args.max_new_tokens)]
        else:
          spec = DecodeSpec.parse(text, max_new_tokens=args.max_new_tokens)
          specs = [spec, spec.replace(dedup=True)]
        for spec in specs:
          kernels = dryrun.program_report(
            spec, draft_config, target_config, where, batch=b, **common
          ).kernels_per_round
          r = dryrun.round_report(spec, draft_config, target_config, where, batch=b,
                                  kernels=kernels, **common)  # fmt: skip
          ms = 1e3 * r.seconds
          ar_ms = ms if not spec.speculative else ar_ms
          be = efficiency.get(spec.replace(dedup=False).label())
          speedup = "-" if be is None or ar_ms is None else f"{be * ar_ms / ms:.2f}x (BE {be})"
          round_rows.append(dict(
            dataclasses.asdict(r), program=r.label, gflops=r.flops / 1e9, hbm=r.hbm_bytes / 1e9,
            must_move=r.must_move / 1e9, ratio=r.hbm_bytes / r.must_move, ms=ms,
            compiler="-" if r.compiler_bytes is None else _gb(r.compiler_bytes),
            speedup=speedup,
          ))  # fmt: skip
          print(tables.markdown([round_rows[-1]], ROUND_COLS).splitlines()[-1], flush=True)
  print(
    f"\nPrograms (per chip; bench_device's pair, {args.prompt_len}-token prompts, "
    f"{args.max_new_tokens} new tokens, K = {args.num_drafts}, L = {args.draft_len}; "
    "data-dependent: besides the loop of rounds):\n"
  )
  print(tables.markdown(program_rows, dryrun.REPORT_COLS))
  if round_rows:
    print(
      "\nRounds (per chip; the round program unrolled; projected by "
      f"{metrics.ROOFLINE}, {metrics.GPU_KERNEL_S * 1e6:.1f} us per kernel on GPU):\n"
    )
    print(tables.markdown(round_rows, ROUND_COLS))
  return {"programs": program_rows, "rounds": round_rows}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = types.SimpleNamespace(**{holder.name: holder.value for holder in _FLAGS})
  if args.target:
    if any(t.strip().lower().startswith("gpu") for t in args.target.split(",")):
      targets.use_cpu_host()
    start = time.perf_counter()
    report = target_main(args)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"settings": vars(args), **report}, f, indent=1, default=str)
    return
  names = [ALIASES.get(n, n) for n in args.programs.split(",") if n]
  args.per_layer = ALIASES.get(args.per_layer, args.per_layer)
  for n in names + ([args.per_layer] if args.per_layer else []):
    if n not in PROGRAMS:
      raise app.UsageError(f"unknown program {n!r}: choose from {PROGRAMS}")
  program_spec("tails", args)  # a clear error for a bad method, scheme, K or L
  start = time.perf_counter()
  draft_config, target_config = pair_configs(args)
  draft, target = abstract_bundle(draft_config), abstract_bundle(target_config)
  print(
    f"Program report ({'small' if args.small else 'device-size'} pair, abstract "
    f"parameters, {jax.default_backend()} backend, jax {jax.__version__}): batch "
    f"{args.batch}, prompt width {args.prompt_len}, {args.max_new_tokens} new tokens, "
    f"compute dtype {args.dtype}; target {target_config.num_layers} layers, draft "
    f"{draft_config.num_layers}, V = {target_config.vocab_size}\n"
  )
  layer_stack = LAYER_STACKS[args.scan_layers]
  rows = [measure(n, args, draft, target, layer_stack) for n in names]
  print(format_table(rows))
  layer = None
  if args.per_layer:
    layer = per_layer(args.per_layer, args, draft_config, target_config)
    print()
    print(format_per_layer(layer))
  print(f"\ntotal {time.perf_counter() - start:.0f} s")
  if args.json:
    report = {"settings": vars(args), "programs": rows, "per_layer": layer}
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  app.run(main)
