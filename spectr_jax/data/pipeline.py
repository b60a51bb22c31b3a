"""Tokenized, cached datasets and deterministic packed batches for LM training.

A training row holds `seq_len + 1` tokens: whole sentences, each as BOS ids EOS,
packed in a seeded order and right-padded with PAD; a sentence longer than a row is
cut to BOS and its first `seq_len` ids. Training batch `i` is a pure function of
`(seed, i)`, so a resumed run sees the batches an uninterrupted one would.
"""

import dataclasses
import hashlib
import json
import pathlib

import numpy as np

from spectr_jax.data.config import DataConfig
from spectr_jax.data.sources import DataError, embedded_data_dir, read_source
from spectr_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, load_or_train_tokenizer

_CACHE_VERSION = 1
_PACK_STREAM = 0
_EPOCH_STREAM = 1


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """Sentences as one flat id array plus offsets (no BOS or EOS stored).

  Attributes:
    tokens: int32 ids of all sentences, concatenated.
    offsets: int64 start of each sentence in `tokens`, plus the end (length S + 1).
  """

  tokens: np.ndarray
  offsets: np.ndarray

  def __len__(self) -> int:
    return len(self.offsets) - 1

  @property
  def lengths(self) -> np.ndarray:
    """Number of ids of each sentence, shape [S]."""
    return np.diff(self.offsets)

  @property
  def num_tokens(self) -> int:
    """Ids plus one EOS per sentence: the tokens a model predicts."""
    return int(self.tokens.size + len(self))

  def sentence(self, i: int) -> np.ndarray:
    """Returns the ids of sentence `i`."""
    return self.tokens[self.offsets[i] : self.offsets[i + 1]]

  @classmethod
  def from_ids(cls, ids: list[list[int]]) -> "TokenizedSplit":
    """Builds a split from per-sentence id lists."""
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    tokens = np.fromiter((t for x in ids for t in x), np.int32, count=int(offsets[-1]))
    return cls(tokens=tokens, offsets=offsets)


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A tokenized source: the tokenizer, both splits and what was dropped on reading."""

  tokenizer: Tokenizer
  train: TokenizedSplit
  heldout: TokenizedSplit
  stats: dict[str, int]
  cache_dir: pathlib.Path


def _cache_dir(config: DataConfig) -> pathlib.Path:
  """Names the cache by the fields that decide the text of both splits."""
  if config.source == "embedded":
    location = str(embedded_data_dir())
  else:
    location = str(pathlib.Path(config.path).expanduser().resolve()) if config.path else ""
  key = json.dumps(
    [_CACHE_VERSION, config.source, location, config.heldout_fraction, config.max_train_sentences]
  )
  digest = hashlib.sha256(key.encode()).hexdigest()[:12]
  return config.resolved_cache_dir() / f"{config.source}-{digest}"


def _tokenizer_path(config: DataConfig, cache: pathlib.Path) -> pathlib.Path:
  return cache / (
    f"spm-{config.tokenizer_type}-{config.vocab_size}-{config.tokenizer_sentences}"
    f"-t{config.tokenizer_threads}-c{config.character_coverage}.model"
  )


def _save_npz(path: pathlib.Path, **arrays: np.ndarray) -> None:
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "wb") as f:
    np.savez(f, **arrays)
  tmp.replace(path)


def load_dataset(config: DataConfig) -> Dataset:
  """Reads, tokenizes and caches a source (tokenizer and ids are reused when cached).

  Args:
    config: the data configuration.

  Returns:
    The dataset; its tokenizer has `config.vocab_size` entries.
  """
  cache = _cache_dir(config)
  tokenizer_path = _tokenizer_path(config, cache)
  if tokenizer_path.is_file():
    tokenizer = Tokenizer.load(tokenizer_path)
    tokenizer.check_vocab(config.vocab_size)
    tokens_path = cache / f"tokens-{hashlib.sha256(tokenizer.model_proto).hexdigest()[:12]}.npz"
    if tokens_path.is_file():
      with np.load(tokens_path) as f:
        arrays = dict(f)
      stats = json.loads((cache / "stats.json").read_text())
      return Dataset(
        tokenizer=tokenizer,
        train=TokenizedSplit(arrays["train_tokens"], arrays["train_offsets"]),
        heldout=TokenizedSplit(arrays["heldout_tokens"], arrays["heldout_offsets"]),
        stats=stats,
        cache_dir=cache,
      )
  text = read_source(config)
  cache.mkdir(parents=True, exist_ok=True)
  tokenizer = load_or_train_tokenizer(text.train, config, tokenizer_path)
  train = TokenizedSplit.from_ids(tokenizer.encode_batch(text.train))
  heldout = TokenizedSplit.from_ids(tokenizer.encode_batch(text.heldout))
  stats = dict(text.stats, train_tokens=train.num_tokens, heldout_tokens=heldout.num_tokens)
  (cache / "stats.json").write_text(json.dumps(stats, indent=2))
  tokens_path = cache / f"tokens-{hashlib.sha256(tokenizer.model_proto).hexdigest()[:12]}.npz"
  _save_npz(
    tokens_path,
    train_tokens=train.tokens,
    train_offsets=train.offsets,
    heldout_tokens=heldout.tokens,
    heldout_offsets=heldout.offsets,
  )
  return Dataset(tokenizer=tokenizer, train=train, heldout=heldout, stats=stats, cache_dir=cache)


def pack_rows(split: TokenizedSplit, order: np.ndarray, seq_len: int) -> np.ndarray:
  """Packs sentences (as BOS ids EOS) into rows of `seq_len + 1` tokens, next-fit.

  Args:
    split: the sentences.
    order: int indices of the sentences in packing order.
    seq_len: model input length; rows are one longer (inputs and shifted targets).

  Returns:
    int32 rows [R, seq_len + 1], right-padded with PAD.
  """
  width = seq_len + 1
  if width < 3:
    raise DataError(f"seq_len must be at least 2, got {seq_len}")
  ids_len = split.lengths[order]
  piece_len = np.minimum(ids_len + 2, width)
  row_of = np.empty(len(order), np.int64)
  col_of = np.empty(len(order), np.int64)
  row, col = 0, 0
  for k, n in enumerate(piece_len.tolist()):
    if col + n > width:
      row, col = row + 1, 0
    row_of[k], col_of[k] = row, col
    col += n
  piece_start = np.repeat(np.cumsum(piece_len) - piece_len, piece_len)
  within = np.arange(int(piece_len.sum())) - piece_start
  sentence_ids_len = np.repeat(ids_len, piece_len)
  source = np.repeat(split.offsets[order], piece_len) + within - 1
  source = np.clip(source, 0, max(split.tokens.size - 1, 0))
  stream = np.where(
    within == 0,
    BOS_ID,
    np.where(within > sentence_ids_len, EOS_ID, split.tokens[source] if split.tokens.size else 0),
  )
  rows = np.full((row + 1, width), PAD_ID, np.int32)
  rows.reshape(-1)[np.repeat(row_of * width + col_of, piece_len) + within] = stream
  return rows


class TrainBatches:
  """Training batches where batch `i` depends only on `(seed, i)`.

  Sentences are packed once in a seeded order; epoch `e` visits the rows in a
  permutation seeded by `(seed, e)`, `len(rows) // batch_size` batches per epoch.
  """

  def __init__(self, split: TokenizedSplit, seq_len: int, batch_size: int, seed: int):
    """Packs the rows.

    Args:
      split: training sentences.
      seq_len: model input length.
      batch_size: rows per batch.
      seed: data seed.
    """
    order = np.random.default_rng((seed, _PACK_STREAM)).permutation(len(split))
    self.rows = pack_rows(split, order, seq_len)
    self.batch_size = batch_size
    self.seed = seed
    self.steps_per_epoch = len(self.rows) // batch_size
    if self.steps_per_epoch == 0:
      raise DataError(f"{len(self.rows)} packed rows do not fill one batch of {batch_size}")
    self._epoch = -1
    self._perm = np.empty(0, np.int64)

  def __call__(self, step: int) -> np.ndarray:
    """Returns int32 tokens [B, seq_len + 1] of batch `step`."""
    epoch, index = divmod(step, self.steps_per_epoch)
    if epoch != self._epoch:
      rng = np.random.default_rng((self.seed, _EPOCH_STREAM, epoch))
      self._perm = rng.permutation(len(self.rows))
      self._epoch = epoch
    return self.rows[self._perm[index * self.batch_size : (index + 1) * self.batch_size]]


def heldout_rows(split: TokenizedSplit, seq_len: int, max_rows: int = 0) -> np.ndarray:
  """Packs held-out sentences in their stored order (no shuffling).

  Args:
    split: held-out sentences.
    seq_len: model input length.
    max_rows: keep at most this many rows (0 = all).

  Returns:
    int32 rows [R, seq_len + 1].
  """
  rows = pack_rows(split, np.arange(len(split)), seq_len)
  return rows[:max_rows] if max_rows else rows
