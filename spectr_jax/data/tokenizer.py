"""SentencePiece tokenizer trained deterministically on the training split.

Reserved ids (the same for every vocabulary size): `PAD_ID = 0` pads rows and prompts,
`UNK_ID = 1`, `BOS_ID = 2` starts every sentence, `EOS_ID = 3` ends it.
"""

import dataclasses
import io
import pathlib
from collections.abc import Sequence

import sentencepiece as spm

from spectr_jax.data.config import DataConfig
from spectr_jax.data.sources import DataError

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
_SPM_SEED = 0


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The ids a pair's data and decoding treat specially.

  Attributes:
    bos: starts every prompt (None: the tokenizer has no BOS, prompts start with text).
    eos: the stop tokens (any of them ends a row; several for Llama 3 and Gemma).
    pad: right-pads prompts and rows.
  """

  bos: int | None = BOS_ID
  eos: tuple[int, ...] = (EOS_ID,)
  pad: int = PAD_ID


RESERVED = SpecialIds()  # The reserved ids of every SentencePiece tokenizer here.


class Tokenizer:
  """A SentencePiece model with the reserved ids above."""

  special = RESERVED

  def __init__(self, model_proto: bytes):
    """Builds the tokenizer from a serialized SentencePiece model."""
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    reserved = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
    if reserved != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
      raise DataError(f"tokenizer reserved ids (pad, unk, bos, eos) are {reserved}")

  @classmethod
  def load(cls, path: str | pathlib.Path) -> "Tokenizer":
    """Loads a `.model` file written by `save`."""
    path = pathlib.Path(path)
    if not path.is_file():
      raise DataError(f"tokenizer model {path} does not exist")
    return cls(path.read_bytes())

  def save(self, path: str | pathlib.Path) -> None:
    """Writes the serialized model to `path` (atomically)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(self.model_proto)
    tmp.replace(path)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Returns the ids of `text`, without BOS or EOS."""
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Returns the ids of each text, without BOS or EOS."""
    return self._sp.encode(list(texts))

  def decode(self, ids: Sequence[int]) -> str:
    """Returns the text of `ids`; PAD, BOS and EOS are skipped."""
    return self._sp.decode([int(i) for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

  def check_vocab(self, vocab_size: int) -> None:
    """Raises `DataError` unless the vocabulary has exactly `vocab_size` entries."""
    if self.vocab_size != vocab_size:
      raise DataError(
        f"tokenizer vocabulary has {self.vocab_size} entries but the model expects "
        f"vocab_size={vocab_size}; retrain the tokenizer or fix the model config"
      )


def train_tokenizer(sentences: Sequence[str], config: DataConfig) -> Tokenizer:
  """Trains a SentencePiece model; the same inputs give the same model bytes.

  Args:
    sentences: training sentences; the first `config.tokenizer_sentences` are used.
    config: the `vocab_size`, `tokenizer_*` and `character_coverage` fields are used.

  Returns:
    The trained tokenizer.
  """
  if config.tokenizer_type not in ("unigram", "bpe"):
    raise DataError(f"tokenizer_type must be 'unigram' or 'bpe', got {config.tokenizer_type!r}")
  if not sentences:
    raise DataError("cannot train a tokenizer on no sentences")
  writer = io.BytesIO()
  spm.set_random_generator_seed(_SPM_SEED)
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences[: config.tokenizer_sentences]),
      model_writer=writer,
      vocab_size=config.vocab_size,
      model_type=config.tokenizer_type,
      pad_id=PAD_ID,
      unk_id=UNK_ID,
      bos_id=BOS_ID,
      eos_id=EOS_ID,
      character_coverage=config.character_coverage,
      input_sentence_size=0,
      num_threads=config.tokenizer_threads,
      minloglevel=2,
    )
  except RuntimeError as e:
    raise DataError(f"SentencePiece training failed: {e}") from e
  return Tokenizer(writer.getvalue())


def load_or_train_tokenizer(
  sentences: Sequence[str], config: DataConfig, path: pathlib.Path
) -> Tokenizer:
  """Loads the tokenizer at `path`, or trains it on `sentences` and saves it there.

  Args:
    sentences: training sentences, used only when `path` does not exist yet.
    config: the data configuration.
    path: the `.model` file.

  Returns:
    A tokenizer whose vocabulary has `config.vocab_size` entries.
  """
  if path.is_file():
    tokenizer = Tokenizer.load(path)
  else:
    tokenizer = train_tokenizer(sentences, config)
    tokenizer.save(path)
  tokenizer.check_vocab(config.vocab_size)
  return tokenizer
