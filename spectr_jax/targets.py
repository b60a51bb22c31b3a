"""Compile-only accelerator targets: TPU slices and NVIDIA GPUs, built from this host.

A target is a chip and a topology named `platform:chip[:topology]`:

  tpu:v5e:2x2   tpu:v5p:2x2x1   tpu:v6e:2x4   tpu:v4:2x2x1   (any slice libtpu knows)
  gpu:h100      gpu:h200        gpu:b200      gpu:a100       (one GPU)

`Target.devices()` returns XLA's compile-only devices of the topology: a program lowered
for a mesh of them compiles here, `memory_analysis()` answers (and on TPU
`cost_analysis()`), nothing runs. TPU targets need libtpu (`pip install -e '.[tpu]'`);
GPU targets need jax's CUDA plugin (`scripts/setup_gpu_compile.sh`) in a process whose
JAX platform is the CPU (`use_cpu_host()` first). The GPU devices are described by the
data files in `target_configs/` (an XLA `GpuTargetConfigProto` each).

Each chip carries its published facts: HBM per chip, HBM bandwidth and the dense bf16
matmul peak (the roofline projection of `spectr_jax.roofline` and the memory checks).
"""

import dataclasses
import os
import pathlib
import re

import jax

__all__ = ["CHIPS", "Chip", "Target", "chip_of", "parse", "use_cpu_host"]

GIB = 2**30
_CONFIGS = pathlib.Path(__file__).parent / "target_configs"


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's published facts.

  Attributes:
    key: the short name in target names ("v5e", "h100").
    platform: "tpu" or "gpu".
    name: the product name.
    hbm_bytes: memory per chip (TPU: the GiB Google publishes; GPU: what the CUDA runtime
      reports, as in the target config).
    hbm_bandwidth: bytes/s of HBM.
    matmul_flops: dense bf16 matmul FLOP/s.
    source: where the numbers come from.
  """

  key: str
  platform: str
  name: str
  hbm_bytes: int
  hbm_bandwidth: float
  matmul_flops: float
  source: str


CHIPS: dict[str, Chip] = {
  c.key: c
  for c in (
    Chip("v4", "tpu", "TPU v4", 32 * GIB, 1.2e12, 275e12, "Google Cloud TPU v4 documentation"),
    Chip("v5e", "tpu", "TPU v5e", 16 * GIB, 819e9, 197e12, "Google Cloud TPU v5e documentation"),
    Chip("v5p", "tpu", "TPU v5p", 95 * GIB, 2765e9, 459e12, "Google Cloud TPU v5p documentation"),
    Chip("v6e", "tpu", "TPU v6e", 32 * GIB, 1640e9, 918e12, "Google Cloud TPU v6e documentation"),
    Chip("a100", "gpu", "NVIDIA A100 80GB", 85197848576, 2.04e12, 312e12, "NVIDIA A100 data sheet"),
    Chip("h100", "gpu", "NVIDIA H100 SXM", 85520809984, 3.35e12, 989e12, "NVIDIA H100 data sheet"),
    Chip("h200", "gpu", "NVIDIA H200 SXM", 150754820096, 4.8e12, 989e12, "NVIDIA H200 data sheet"),
    Chip("b200", "gpu", "NVIDIA B200", 192265846784, 8e12, 2250e12, "NVIDIA HGX B200 data sheet"),
  )
}
# The slice of a TPU target named without a topology.
_DEFAULT_TPU_TOPOLOGY = {"v4": "2x2x1", "v5e": "2x2", "v5p": "2x2x1", "v6e": "2x2"}


@dataclasses.dataclass(frozen=True)
class Target:
  """A compile-only target (see the module docstring).

  Attributes:
    name: as given, e.g. "tpu:v5e:2x2".
    chip: the chip.
    topology: libtpu's topology name ("v5e:2x2") or the GPU plugin's ("1x1x1").
  """

  name: str
  chip: Chip
  topology: str

  @property
  def platform(self) -> str:
    return self.chip.platform

  def devices(self) -> list[jax.Device]:
    """The topology's compile-only devices (module docstring).

    Raises:
      RuntimeError: the platform's compiler is not installed, with the command that
        installs it.
    """
    from jax.experimental import topologies

    if self.platform == "tpu":
      try:
        import libtpu  # noqa: F401
      except ImportError:
        raise RuntimeError(
          f"target {self.name} needs libtpu: pip install -e '.[tpu]' (about 700 MB)"
        ) from None
      # libtpu takes a lock file per host; compile-only use needs no TPU, so several
      # processes (test workers, a report beside a sweep) may load it at once.
      os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
      return list(topologies.get_topology_desc(self.topology, platform="tpu").devices)
    try:
      import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError:
      raise RuntimeError(
        f"target {self.name} needs jax's CUDA plugin: bash scripts/setup_gpu_compile.sh "
        "(a separate environment, about 5 GB)"
      ) from None
    text = (_CONFIGS / f"{self.chip.key}.txtpb").read_text()
    desc = topologies.get_topology_desc(platform="cuda", topology=self.topology, target_config=text)
    return list(desc.devices)


def parse(name: str) -> Target:
  """The target named `name` ("tpu:v5e:2x2", "gpu:h100"; module docstring).

  Raises:
    ValueError: an unknown platform, chip or topology, naming the known ones.
  """
  parts = name.lower().split(":")
  known = ", ".join(f"{c.platform}:{c.key}" for c in CHIPS.values())
  if len(parts) not in (2, 3) or parts[1] not in CHIPS or CHIPS[parts[1]].platform != parts[0]:
    raise ValueError(f"unknown target {name!r}: platform:chip[:topology], chips {known}")
  chip = CHIPS[parts[1]]
  if chip.platform == "gpu":
    if len(parts) == 3 and parts[2] not in ("1", "1x1x1"):
      raise ValueError(f"GPU targets are one GPU ({chip.platform}:{chip.key}), got target {name!r}")
    return Target(name, chip, "1x1x1")
  topology = parts[2] if len(parts) == 3 else _DEFAULT_TPU_TOPOLOGY[chip.key]
  if not re.fullmatch(r"\d+(x\d+){1,2}", topology):
    raise ValueError(f"TPU topology must be like 2x2 or 2x2x1, got {topology!r} in target {name!r}")
  return Target(name, chip, f"{chip.key}:{topology}")


# Device kinds as JAX reports them -> chip keys (the longest match wins).
_DEVICE_KINDS = {
  "tpu v4": "v4", "tpu v5 lite": "v5e", "tpu v5e": "v5e", "tpu v5": "v5p", "tpu v5p": "v5p",
  "tpu v6 lite": "v6e", "tpu v6e": "v6e", "a100": "a100", "h100": "h100", "h200": "h200",
  "b200": "b200",
}  # fmt: skip


def chip_of(device: jax.Device) -> Chip | None:
  """The chip of a device (a compile-only one, or one this process runs on) by its
  `device_kind`, None for one not in `CHIPS` (a CPU)."""
  kind = device.device_kind.lower()
  found = [k for k in _DEVICE_KINDS if k in kind]
  return CHIPS[_DEVICE_KINDS[max(found, key=len)]] if found else None


def use_cpu_host() -> None:
  """Makes the CPU this process's JAX platform, so a GPU target's plugin compiles without
  looking for a GPU; a no-op when JAX_PLATFORMS is set.

  Raises:
    RuntimeError: JAX's backends already started (call this before any computation).
  """
  if os.environ.get("JAX_PLATFORMS"):
    return
  from jax._src import xla_bridge

  if xla_bridge.backends_are_initialized():
    raise RuntimeError(
      "GPU targets compile in a process whose JAX platform is the CPU: call "
      "targets.use_cpu_host() before any computation, or set JAX_PLATFORMS=cpu"
    )
  jax.config.update("jax_platforms", "cpu")
