"""Tokenizers (SentencePiece, Hugging Face), text sources (embedded BBC News, LM1B text,
TFDS lm1b), batches and prompts."""

from spectr_jax.data.config import DataConfig, default_workdir
from spectr_jax.data.hf_tokenizer import HFTokenizer
from spectr_jax.data.pipeline import (
  Dataset,
  TokenizedSplit,
  TrainBatches,
  heldout_rows,
  load_dataset,
  pack_rows,
)
from spectr_jax.data.prompts import Prompts, make_prompts
from spectr_jax.data.sources import SOURCES, DataError, SplitText, read_source, split_sentences
from spectr_jax.data.tokenizer import (
  BOS_ID,
  EOS_ID,
  PAD_ID,
  RESERVED,
  UNK_ID,
  SpecialIds,
  Tokenizer,
  load_or_train_tokenizer,
  train_tokenizer,
)

__all__ = [
  "BOS_ID",
  "EOS_ID",
  "PAD_ID",
  "RESERVED",
  "SOURCES",
  "SpecialIds",
  "UNK_ID",
  "DataConfig",
  "DataError",
  "Dataset",
  "HFTokenizer",
  "Prompts",
  "SplitText",
  "TokenizedSplit",
  "Tokenizer",
  "TrainBatches",
  "default_workdir",
  "heldout_rows",
  "load_dataset",
  "load_or_train_tokenizer",
  "make_prompts",
  "pack_rows",
  "read_source",
  "split_sentences",
  "train_tokenizer",
]
