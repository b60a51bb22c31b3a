"""Fixed-trip loops that a program built for cost analysis unrolls.

XLA's cost analysis counts the body of a `while` once, whatever its trip count, so the
flops and bytes it reports for a round that drafts L tokens in a loop are those of one
draft step. The round's fixed-trip loops (the draft's depth loop, the block walk, K-SEQ's
rho* evaluations...) go through `scan` and `fori_loop` here; traced inside `unrolled()`
they are unrolled, and the compiler's numbers for the program are per round
(`engine.lower_round(unroll=True)`). Elsewhere they are `jax.lax.scan` and
`jax.lax.fori_loop` as they are.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import jax

__all__ = ["fori_loop", "scan", "unrolled"]

_UNROLL = contextvars.ContextVar("spectr_jax_unroll_loops", default=False)


@contextlib.contextmanager
def unrolled() -> Iterator[None]:
  """Unrolls the `scan`s and `fori_loop`s traced inside the block."""
  token = _UNROLL.set(True)
  try:
    yield
  finally:
    _UNROLL.reset(token)


def scan(f: Callable, init: Any, xs: Any = None, length: int | None = None) -> tuple[Any, Any]:
  """`jax.lax.scan(f, init, xs, length)`, unrolled inside `unrolled()`."""
  return jax.lax.scan(f, init, xs, length=length, unroll=True if _UNROLL.get() else 1)


def fori_loop(lower: int, upper: int, body: Callable, init: Any) -> Any:
  """`jax.lax.fori_loop` over static bounds, unrolled inside `unrolled()`."""
  return jax.lax.fori_loop(lower, upper, body, init, unroll=True if _UNROLL.get() else None)
