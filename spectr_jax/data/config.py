"""The data configuration that the library takes, and the default work directory."""

import dataclasses
import os
import pathlib

WORKDIR_ENV = "SPECTR_WORKDIR"


def default_workdir() -> pathlib.Path:
  """Returns `$SPECTR_WORKDIR` when set, else `~/.cache/spectr_jax`."""
  return pathlib.Path(os.environ.get(WORKDIR_ENV) or "~/.cache/spectr_jax").expanduser()


def resolve(path: str | pathlib.Path) -> pathlib.Path:
  """`path` itself when absolute, else relative to $SPECTR_WORKDIR."""
  return default_workdir() / pathlib.Path(path).expanduser()


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the text comes from, how it is tokenized and how it is cut into sequences.

  Attributes:
    source: "embedded", "lm1b_text" or "tfds" (see `spectr_jax.data.sources.SOURCES`).
    path: directory of the source: the LM1B text layout for "lm1b_text", the TFDS data
      directory for "tfds" ("" = the TFDS default); unused by "embedded".
    heldout_fraction: share of articles (embedded) or sentences (a directory without
      held-out files) that goes to the held-out split.
    max_train_sentences: keep at most this many training sentences (0 = all).
    vocab_size: SentencePiece vocabulary size; must equal the model's.
    tokenizer_type: SentencePiece model type, "unigram" or "bpe".
    tokenizer_sentences: at most this many training sentences train the tokenizer.
    tokenizer_threads: SentencePiece trainer threads (fixed: the model bytes depend on it).
    character_coverage: share of training characters the vocabulary must cover (1.0 keeps
      rare capitals and symbols of the small embedded corpus out of UNK).
    seq_len: tokens a model sees per training row (rows hold `seq_len + 1` tokens).
    cache_dir: where tokenizers and token arrays are cached ("" = `<workdir>/data`).
  """

  source: str = "embedded"
  path: str = ""
  heldout_fraction: float = 0.05
  max_train_sentences: int = 0
  vocab_size: int = 4096
  tokenizer_type: str = "unigram"
  tokenizer_sentences: int = 2_000_000
  tokenizer_threads: int = 2
  character_coverage: float = 1.0
  seq_len: int = 128
  cache_dir: str = ""

  def resolved_cache_dir(self) -> pathlib.Path:
    """Returns the cache directory, defaulting to `default_workdir() / "data"`."""
    return (
      pathlib.Path(self.cache_dir).expanduser() if self.cache_dir else default_workdir() / "data"
    )
