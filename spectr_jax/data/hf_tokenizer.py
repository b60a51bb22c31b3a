"""The tokenizer of a Hugging Face checkpoint directory (`tokenizer.json`).

It has the interface of the SentencePiece `Tokenizer` that the data pipeline and the
experiments use (`encode`, `encode_batch`, `decode`, `vocab_size`, `special`), so held-out
text is cut into prompts by the pair's own tokenizer. BOS, EOS and PAD come from
`generation_config.json` over `config.json`; `eos_token_id` may be a list (Llama 3,
Gemma), and every id of it stops a row.
"""

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import tokenizers

from spectr_jax.data.sources import DataError
from spectr_jax.data.tokenizer import SpecialIds


def _read_json(path: pathlib.Path) -> dict[str, Any]:
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as error:
    raise DataError(f"{path} is not valid JSON: {error}") from error


def _ids(value: Any, name: str, path: pathlib.Path) -> tuple[int, ...]:
  """An id or a list of ids of a config file as a tuple (None: empty)."""
  if value is None:
    return ()
  values = value if isinstance(value, list) else [value]
  if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
    raise DataError(f"{name} in {path} must be an id or a list of ids, got {value!r}")
  return tuple(values)


def _special_ids(directory: pathlib.Path) -> SpecialIds:
  """BOS, EOS and PAD from generation_config.json, falling back to config.json."""
  values: dict[str, Any] = {}
  sources = {}
  for name in ("config.json", "generation_config.json"):  # The later file wins.
    path = directory / name
    if path.is_file():
      found = _read_json(path)
      for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if found.get(key) is not None:
          values[key], sources[key] = found[key], path
  bos = _ids(values.get("bos_token_id"), "bos_token_id", sources.get("bos_token_id"))
  eos = _ids(values.get("eos_token_id"), "eos_token_id", sources.get("eos_token_id"))
  pad = _ids(values.get("pad_token_id"), "pad_token_id", sources.get("pad_token_id"))
  if len(bos) > 1:
    raise DataError(f"bos_token_id in {sources['bos_token_id']} must be one id, got {bos}")
  if not eos:
    raise DataError(f"no eos_token_id in {directory}/config.json or generation_config.json")
  return SpecialIds(bos=bos[0] if bos else None, eos=eos, pad=(pad or eos)[0])


class HFTokenizer:
  """A `tokenizers.Tokenizer` with its special ids, read from a checkpoint directory."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, special: SpecialIds, source: str = ""):
    """Wraps a loaded tokenizer.

    Args:
      tokenizer: the `tokenizers.Tokenizer`.
      special: its BOS, EOS and PAD ids (each must be a token of the vocabulary).
      source: where it was read from (for error messages).
    """
    self._tokenizer = tokenizer
    self.special = special
    self.source = source
    ids = [i for i in (special.bos, special.pad, *special.eos) if i is not None]
    if max(ids) >= self.vocab_size:
      raise DataError(
        f"special ids {special} of {source or 'the tokenizer'} are not all below its "
        f"vocabulary size {self.vocab_size}"
      )

  @classmethod
  def load(cls, directory: str | pathlib.Path) -> "HFTokenizer":
    """Reads `tokenizer.json` and the special ids of a checkpoint directory."""
    directory = pathlib.Path(directory).expanduser()
    path = directory / "tokenizer.json"
    if not directory.is_dir():
      raise DataError(
        f"{directory} is not a directory: a pretrained model is read from a local Hugging "
        "Face checkpoint directory (config.json, model.safetensors, tokenizer.json); "
        "nothing is downloaded at run time"
      )
    if not path.is_file():
      raise DataError(f"no tokenizer.json in {directory} (a Hugging Face checkpoint holds one)")
    try:
      tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # The Rust library raises plain Exceptions.
      raise DataError(f"cannot read {path}: {error}") from error
    return cls(tokenizer, _special_ids(directory), str(directory))

  @property
  def vocab_size(self) -> int:
    """The number of token ids, added tokens included (max id + 1)."""
    return max(self.vocabulary().values()) + 1

  def vocabulary(self) -> dict[str, int]:
    """Every token string with its id, added tokens included."""
    return self._tokenizer.get_vocab(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    """Returns the ids of `text`, without BOS or EOS."""
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Returns the ids of each text, without BOS or EOS."""
    encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [e.ids for e in encoded]

  def decode(self, ids: Sequence[int]) -> str:
    """Returns the text of `ids`; special tokens are skipped."""
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

  def check_vocab(self, vocab_size: int) -> None:
    """Raises `DataError` when a model with `vocab_size` rows cannot emit every token."""
    if vocab_size < self.vocab_size:
      raise DataError(
        f"{self.source}: the tokenizer has {self.vocab_size} tokens but the model only "
        f"{vocab_size} embedding rows"
      )

  def first_difference(self, other: "HFTokenizer") -> str | None:
    """None when both tokenize alike (the same tokens with the same ids, the same split
    of a probe text), else a sentence naming the first difference. Special ids are not
    compared: a pair decodes with its target's."""
    mine, theirs = ({i: t for t, i in tok.vocabulary().items()} for tok in (self, other))
    for i in range(max(len(mine), len(theirs))):
      if mine.get(i) != theirs.get(i):
        return f"id {i} is {mine.get(i)!r} in one and {theirs.get(i)!r} in the other"
    probe = "The quick brown fox, 1234 times; naïve café."
    if self.encode(probe) != other.encode(probe):
      return f"the same vocabulary tokenizes {probe!r} differently (merges or normaliser)"
    return None
