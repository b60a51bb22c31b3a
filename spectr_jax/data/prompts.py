"""Prompt sets for decoding experiments: the starts of held-out sentences."""

import dataclasses

import numpy as np

from spectr_jax.data.pipeline import TokenizedSplit
from spectr_jax.data.sources import DataError
from spectr_jax.data.tokenizer import RESERVED, SpecialIds


@dataclasses.dataclass(frozen=True)
class Prompts:
  """Right-padded prompts.

  Attributes:
    tokens_BxP: int32 [B, prompt_len + 1]: BOS, then the first ids of a sentence, then PAD
      ([B, prompt_len] without BOS, for tokenizers that have none).
    lengths_B: int32 [B]: tokens of each prompt, BOS included.
    sentence_index_B: int64 [B]: which held-out sentence each prompt starts.
  """

  tokens_BxP: np.ndarray
  lengths_B: np.ndarray
  sentence_index_B: np.ndarray


def make_prompts(
  heldout: TokenizedSplit,
  num_prompts: int,
  prompt_len: int,
  seed: int,
  special: SpecialIds = RESERVED,
) -> Prompts:
  """Takes BOS plus the first `prompt_len` ids of held-out sentences drawn by `seed`.

  Sentences are drawn without replacement among those with at least one id; a sentence
  shorter than `prompt_len` gives a shorter prompt (see `lengths_B`).

  Args:
    heldout: held-out sentences.
    num_prompts: B, the number of prompts.
    prompt_len: ids taken from each sentence, at most.
    seed: selects the sentences; the same seed gives the same prompts.
    special: the tokenizer's BOS (None: no BOS) and PAD ids.

  Returns:
    The prompts.
  """
  if prompt_len < 1 or num_prompts < 1:
    raise DataError(f"need num_prompts >= 1 and prompt_len >= 1, got {num_prompts}, {prompt_len}")
  candidates = np.flatnonzero(heldout.lengths > 0)
  if num_prompts > len(candidates):
    raise DataError(f"asked for {num_prompts} prompts, only {len(candidates)} held-out sentences")
  chosen = np.random.default_rng(seed).choice(candidates, size=num_prompts, replace=False)
  start = 0 if special.bos is None else 1
  tokens = np.full((num_prompts, start + prompt_len), special.pad, np.int32)
  if special.bos is not None:
    tokens[:, 0] = special.bos
  lengths = np.empty(num_prompts, np.int32)
  for b, i in enumerate(chosen):
    ids = heldout.sentence(int(i))[:prompt_len]
    tokens[b, start : start + len(ids)] = ids
    lengths[b] = start + len(ids)
  return Prompts(tokens_BxP=tokens, lengths_B=lengths, sentence_index_B=chosen.astype(np.int64))
