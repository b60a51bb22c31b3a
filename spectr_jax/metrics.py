"""The accelerator latency model used by the benchmarks and reports (no JAX)."""


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
