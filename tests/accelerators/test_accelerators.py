"""Programs built for accelerators from this host (`spectr_jax.targets`, `spectr_jax.dryrun`):
the tiny pair's decode programs compiled for a compile-only TPU slice (libtpu, the `tpu`
extra that .ci/run installs; skipped without it), and the target names. The GPU path
needs jax's CUDA plugin (about 5 GB): scripts/setup_gpu_compile.sh, not CI."""

import dataclasses
import pathlib
import sys

import pytest

from spectr_jax import dryrun, programs, targets
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import HeadConfig, ModelConfig

V = 1024
TARGET = "tpu:v5e:2x2"
BATCH, WIDTH = 8, 8
SPECS = {
  "ar": DecodeSpec("autoregressive", max_new_tokens=16),
  "tails": DecodeSpec("kseq", 4, 3, max_new_tokens=16),
  "tree": DecodeSpec("kseq", 4, 3, dedup=True, max_new_tokens=16),
}


def test_target_names():
  t = targets.parse("tpu:v5p:2x2x1")
  assert (t.platform, t.chip.key, t.topology) == ("tpu", "v5p", "v5p:2x2x1")
  assert targets.parse("tpu:v5e").topology == "v5e:2x2"
  assert targets.parse("gpu:h100").topology == "1x1x1"
  assert targets.parse("GPU:H200").chip.hbm_bandwidth == 4.8e12
  for bad in ("tpu:h100", "gpu:v5e", "tpu:v9:2x2", "tpu:v5e:2-2", "gpu:h100:8", "h100"):
    with pytest.raises(ValueError, match="target"):
      targets.parse(bad)


@pytest.fixture(scope="module")
def pair():
  """A tiny pair in the TPU's tiles (minor dimensions of 128): the test pairs' widths
  of 32 and 64 would be padded to 128 on the chip, which no plan in logical bytes sees."""
  sizes = dict(vocab_size=V, max_len=64, d_model=128, head_dim=128, mlp_dim=256)
  draft = ModelConfig(num_layers=1, num_heads=1, num_kv_heads=1, **sizes)
  return draft, ModelConfig(num_layers=2, num_heads=2, num_kv_heads=1, **sizes)


@pytest.fixture(scope="module")
def where():
  pytest.importorskip("libtpu", reason="compile-only TPU targets need the tpu extra")
  return dryrun.build(TARGET)


@pytest.fixture(scope="module")
def reports(pair, where):
  draft, target = pair
  return {
    name: dryrun.program_report(spec, draft, target, where, batch=BATCH, prompt_width=WIDTH)
    for name, spec in SPECS.items()
  }


def _loops(report):
  """The named scopes of a program's data-dependent constructs besides its loop of rounds."""
  return [programs.scope(n) for n in report.data_dependent]


@pytest.mark.parametrize("name", list(SPECS))
def test_tpu_programs_loop_only_over_rounds(reports, name):
  """The only data-dependent loop is the loop of rounds (TPU loops are read by their
  conditions: `programs.trip_count`); the tree adds its node-count switch; no weight is
  copied."""
  report = reports[name]
  assert report.fits and report.weight_copies == 0
  assert _loops(report) == (["score"] if name == "tree" else []), report.data_dependent
  assert report.kernels_per_round > 0 and report.gpu is None


@pytest.mark.slow
def test_device_size_programs_match_the_memory_plan(where):
  """bench_device's pair (0.95B / 97M, bf16, V = 32k) on TPU v5e 2x2 at batch 8: per chip
  the compiled programs' peak is the memory plan's within 15%, their temporaries are at
  most 10% of their arguments (the weights: none relaid out), and they loop on rounds
  only. (At the tiny pair's sizes the TPU's (8, 128) tiles pad small arrays severalfold,
  which a plan in logical bytes does not see.)"""
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
  try:
    import bench_device
  finally:
    sys.path.pop(0)
  draft, target = (
    ModelConfig(vocab_size=bench_device.VOCAB, max_len=16 + 64 + 9, dtype="bfloat16", **size)
    for size in (bench_device.DRAFT, bench_device.TARGET)
  )
  for name, spec in SPECS.items():
    spec = spec.replace(
      max_new_tokens=64, **({} if name == "ar" else dict(num_drafts=8, draft_len=8))
    )
    report = dryrun.program_report(spec, draft, target, where, batch=8, prompt_width=16)
    assert 0.85 <= report.plan_bytes / report.peak_bytes <= 1.15, report
    assert report.temp_share <= 0.1 and report.weight_copies == 0, report
    assert _loops(report) == (["score"] if name == "tree" else []), report.data_dependent


def test_a_round_projects_from_its_bytes_and_flops(pair, where, reports):
  """The unrolled round program's HBM traffic is within 2x of what a round must move
  (tiny models: the round's small arrays weigh as much as the weights), its flops
  positive, and the projected time the larger of bytes / bandwidth and flops / peak."""
  draft, target = pair
  r = dryrun.round_report(
    SPECS["tails"], draft, target, where, batch=BATCH, prompt_width=WIDTH,
    kernels=reports["tails"].kernels_per_round,
  )  # fmt: skip
  assert 0.5 <= r.hbm_bytes / r.must_move <= 2.0, r
  chip = where.chip
  assert r.flops > 0 and r.seconds == max(
    r.hbm_bytes / chip.hbm_bandwidth, r.flops / chip.matmul_flops
  )


def test_the_dry_run_refuses_a_program_that_does_not_fit(pair, where):
  """On a chip of 1 MB the pair does not fit: every program is refused, with its bytes and
  the answer that no mesh of the slice fits; cells sharing a program compile once."""
  draft, target = pair
  small = dataclasses.replace(where.chip, hbm_bytes=10**6)
  tiny = dataclasses.replace(where, target=dataclasses.replace(where.target, chip=small))
  cells = [("ar seed=0", SPECS["ar"]), ("ar seed=1", SPECS["ar"]), ("tails", SPECS["tails"])]
  builds = dryrun.dry_run(cells, draft, target, tiny, batch=BATCH, prompt_width=WIDTH)
  assert [b.cells for b in builds] == [("ar seed=0", "ar seed=1"), ("tails",)]
  for b in builds:
    assert "of 0.00 GB per chip" in b.refused and "no (data, model) mesh" in b.refused
  # On a chip that holds the pair only once it is split over "model", that mesh is named.
  need = builds[1].report.peak_bytes
  half = dataclasses.replace(where.chip, hbm_bytes=int(need * 0.8))
  mid = dataclasses.replace(where, target=dataclasses.replace(where.target, chip=half))
  (build,) = dryrun.dry_run(cells[2:], draft, target, mid, batch=BATCH, prompt_width=WIDTH)
  assert build.refused and "'model' = " in build.refused, build.refused


@pytest.mark.slow
def test_a_head_drafts_in_a_tpu_program(pair, where):
  """A draft head compiles for the TPU slice like a separate draft: its parameters placed
  in the layouts the chip picks (`placement.decode_placement` probes its prefill with
  features), the loop of rounds the only data-dependent loop, no weight copied."""
  _, target = pair
  head = HeadConfig.of(target, 1)
  report = dryrun.program_report(
    SPECS["tails"], head, target, where, batch=BATCH, prompt_width=WIDTH
  )
  assert report.fits and report.weight_copies == 0 and _loops(report) == []
