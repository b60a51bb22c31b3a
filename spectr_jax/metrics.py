"""The latency models of the benchmarks and reports (no JAX).

Two models predict the speedup of speculative decoding over autoregressive decoding:

- `CostTable`, measured on the device at hand by `scripts/bench_decode.py` (which writes
  it as JSON, `CostTable.save`): a round's predicted time is the sum of its parts'
  measured times (`CostTable.round_ms`), and

    speedup = block_efficiency x t_AR / t_round,

  both rounds predicted from the same table;
- `predicted_speedup`, the memory-bound model of an accelerator with the parameter
  ratio as a draft step's cost: only where no table was measured (on the one H200 run so
  far it charged a K-SEQ 8 x 8 round 1.8 autoregressive steps where it took 5.3);
- `roofline_seconds`, the model of a compiled program on a chip it was built for
  (`spectr_jax.dryrun`): the round's HBM bytes over the bandwidth or its matmul flops over
  the peak, whichever is larger, plus on a GPU a fixed cost per kernel (`GPU_KERNEL_S`).
"""

import dataclasses
import json
import pathlib
from typing import Any

MEMORY_BOUND = "memory-bound model, parameter ratio"
MEASURED = "measured costs"
ROOFLINE = "roofline and kernel-count model"

# Seconds per kernel a GPU round costs beyond its roofline: calibrated on the one H200
# measurement (docs/ACCELERATORS.md, "The kernel cost"): that build's autoregressive step
# took 3.36 ms where its 8.11 GB of HBM traffic need 1.69 ms at 4.8 TB/s, over its 515
# kernels; the same model puts its K-SEQ 8 x 8 round at 18.2 ms, measured 17.9 ms.
GPU_KERNEL_S = 3.2e-6


def roofline_seconds(
  flops: float,
  hbm_bytes: float,
  kernels: int,
  matmul_flops: float,
  hbm_bandwidth: float,
  kernel_s: float = 0.0,
) -> float:
  """A program's time on a chip under the roofline and kernel-count model:

    max(hbm_bytes / hbm_bandwidth, flops / matmul_flops) + kernels x kernel_s

  Args:
    flops: its matmul flops. hbm_bytes: its HBM traffic. kernels: kernels it runs.
    matmul_flops: the chip's dense matmul peak (FLOP/s). hbm_bandwidth: bytes/s.
    kernel_s: the cost of one kernel beyond the roofline (`GPU_KERNEL_S` on a GPU; 0 on
      a TPU, whose per-operation cost the model leaves out).
  """
  return max(hbm_bytes / hbm_bandwidth, flops / matmul_flops) + kernels * kernel_s


def predicted_speedup(block_efficiency: float, draft_len: int, cost_ratio: float) -> float:
  """Speedup over autoregressive decoding under the memory-bound latency model.

  On an accelerator, decoding one step of a model costs about the time to read its
  parameters, so a target call scoring K x (L + 1) positions costs about one target step
  (until compute saturates) and each draft step costs `cost_ratio` target steps (the ratio
  of parameter counts), independently of K. A round then costs 1 + L * cost_ratio target
  steps and emits `block_efficiency` tokens:

    speedup = block_efficiency / (1 + L * cost_ratio)

  Args:
    block_efficiency: tokens per target call.
    draft_len: L (0 for autoregressive decoding).
    cost_ratio: draft step time / target step time.
  """
  return block_efficiency / (1.0 + draft_len * cost_ratio)


def _interpolate(points: dict[int, float], x: float, what: str) -> float:
  """points[x], or the straight line between the nearest measured counts around x
  (x may be a mean, not an integer)."""
  if x in points:
    return points[x]
  below = [k for k in points if k < x]
  above = [k for k in points if k > x]
  if not below or not above:
    raise KeyError(f"{what} {x} is outside the measured {sorted(points)}")
  lo, hi = max(below), min(above)
  return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def verify_key(method: str, num_drafts: int, draft_len: int) -> str:
  """The key of a (method, K, L) in `CostTable.verify_ms`."""
  return f"{method}:{num_drafts}:{draft_len}"


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Measured times (ms) of the parts of a decoding round on one device, one pair and one
  batch size. `scripts/bench_decode.py` measures them (its docstring says how): each in
  loops that alternate the two models as a round does, since a call timed in a loop of
  its own runs with warm processor caches and costs less than in a round, and the
  bookkeeping as the autoregressive round minus its target call and sample.

  A round of (method, K, L) with L > 0 makes L draft calls on K tails (the opening call
  on the pending tokens, then L - 1 steps of one token: `drafting._paths`), one target
  call scoring K(L + 1) positions per row, one verification walk and the round's
  bookkeeping; an autoregressive round (L = 0, K = 1) one target call on one position and
  its sample. Draft costs between measured K and target costs between measured position
  counts are interpolated linearly; verification is looked up per (method, K, L) only.

  Attributes:
    device: the device kind (`jax.devices()[0].device_kind`).
    jax_version: the JAX version that ran the measurement.
    draft_params, target_params: parameter counts of the pair.
    dtype: the models' compute dtype.
    batch: rows per call.
    draft_open_ms: K -> the draft's opening call of a round (the pending tokens of K
      tails), with its sampling.
    draft_step_ms: K -> each later draft step (one token on K tails), with its sampling.
    target_ms: positions scored per row -> one target call with its probabilities.
    verify_ms: `verify_key(method, K, L)` -> the block walk (the sample for
      autoregressive decoding).
    overhead_ms: a round's own work beyond those calls (keys, commit, statistics, the
      loop).
  """

  device: str
  jax_version: str
  draft_params: int
  target_params: int
  dtype: str
  batch: int
  draft_open_ms: dict[int, float]
  draft_step_ms: dict[int, float]
  target_ms: dict[int, float]
  verify_ms: dict[str, float]
  overhead_ms: float

  def covers(self, method: str, num_drafts: int, draft_len: int) -> bool:
    """Whether `round_ms` can predict this round from the measured costs."""
    try:
      self.round_ms(method, num_drafts, draft_len)
    except KeyError:
      return False
    return True

  def round_ms(self, method: str, num_drafts: int, draft_len: int,
               draft_calls: float | None = None,
               positions: float | None = None) -> float:  # fmt: skip
    """The predicted time of one round: the sum of its parts (class docstring); KeyError
    where the table lacks a part. An adaptive round (`DecodeSpec.adaptive`) makes fewer
    draft calls and scores fewer positions than L and K(L + 1): give their means per
    round (the verification is the walk of L's entry)."""
    draft_calls = draft_len if draft_calls is None else draft_calls
    positions = num_drafts * (draft_len + 1) if positions is None else positions
    ms = _interpolate(self.target_ms, positions, "target positions")
    ms += self.verify_ms[verify_key(method, num_drafts, draft_len)]
    ms += self.overhead_ms
    if draft_calls:
      ms += _interpolate(self.draft_open_ms, num_drafts, "drafts")
      ms += max(draft_calls - 1, 0) * _interpolate(self.draft_step_ms, num_drafts, "drafts")
    return ms

  def tokens_per_s(self, block_efficiency: float, method: str, num_drafts: int,
                   draft_len: int, **calls) -> float:  # fmt: skip
    """Predicted decoding speed of the batch: B x block_efficiency tokens per round
    (`calls`: `round_ms`'s draft_calls and positions of adaptive rounds)."""
    round_s = 1e-3 * self.round_ms(method, num_drafts, draft_len, **calls)
    return self.batch * block_efficiency / round_s

  def speedup(self, block_efficiency: float, method: str, num_drafts: int,
              draft_len: int, **calls) -> float:  # fmt: skip
    """Predicted speedup over autoregressive decoding: block_efficiency x t_AR / t_round."""
    ar_ms = self.round_ms("autoregressive", 1, 0)
    return block_efficiency * ar_ms / self.round_ms(method, num_drafts, draft_len, **calls)

  def describe(self) -> str:
    """One line: where and on what the costs were measured."""
    return (
      f"{self.device}, JAX {self.jax_version}, draft {self.draft_params:,} / target "
      f"{self.target_params:,} parameters, {self.dtype}, batch {self.batch}"
    )

  def save(self, path: str | pathlib.Path) -> None:
    """Writes the table as JSON (integer keys as strings)."""
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")

  @classmethod
  def load(cls, path: str | pathlib.Path) -> "CostTable":
    """The table `save` wrote."""
    values: dict[str, Any] = json.loads(pathlib.Path(path).expanduser().read_text())
    for name in ("draft_open_ms", "draft_step_ms", "target_ms"):
      values[name] = {int(k): float(v) for k, v in values[name].items()}
    return cls(**values)
