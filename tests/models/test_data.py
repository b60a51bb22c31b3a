"""Tests of the tokenizer, the text sources, packing, batches and prompts."""

import dataclasses
import sys

import numpy as np
import pytest

from spectr_jax import data
from spectr_jax.data import sources


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> data.DataConfig:
  return data.DataConfig(
    max_train_sentences=2000,
    vocab_size=512,
    seq_len=32,
    cache_dir=str(tmp_path_factory.mktemp("data_cache")),
  )


@pytest.fixture(scope="module")
def dataset(config) -> data.Dataset:
  return data.load_dataset(config)


def _write(path, lines):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(line + "\n" for line in lines))


def test_split_sentences():
  text = 'Title line\n\nHe said "It works." Then it stopped! Why?  Because  3 of us left.\n'
  assert data.split_sentences(text) == [
    "Title line",
    'He said "It works."',
    "Then it stopped!",
    "Why?",
    "Because 3 of us left.",
  ]


def test_embedded_split_is_deterministic_disjoint_and_deduplicated():
  config = data.DataConfig()
  first, second = data.read_source(config), data.read_source(config)
  assert first.train == second.train and first.heldout == second.heldout
  assert not set(first.train) & set(first.heldout)
  assert len(set(first.train)) == len(first.train)
  assert len(set(first.heldout)) == len(first.heldout)
  assert first.stats["documents"] == 2225
  assert 95 <= first.stats["duplicate_documents"] <= 105
  dropped = first.stats["duplicate_sentences"] + first.stats["heldout_in_train_dropped"]
  assert 0.03 < dropped / first.stats["sentences"] < 0.1
  assert 0.03 < len(first.heldout) / (len(first.train) + len(first.heldout)) < 0.08


def test_split_articles_drops_duplicates_and_keeps_heldout_out_of_train():
  shared = "Shared boilerplate sentence."
  articles = [f"Headline {i}\n\nStory number {i} is here. {shared}" for i in range(40)]
  articles.append(articles[3].replace(" ", "  "))
  split = sources.split_articles(articles, data.DataConfig(heldout_fraction=0.3))
  assert split.stats["duplicate_documents"] == 1
  assert split.heldout and split.train
  assert not set(split.train) & set(split.heldout)
  assert (shared in split.train) != (shared in split.heldout)
  assert sum(s.startswith("Story number") for s in split.train + split.heldout) == 40


def test_max_train_sentences():
  split = data.read_source(data.DataConfig(max_train_sentences=100))
  assert len(split.train) == 100


def test_unknown_source_lists_known_ones():
  with pytest.raises(data.DataError, match="embedded, lm1b_text, tfds"):
    data.read_source(data.DataConfig(source="wiki"))


def test_article_errors(tmp_path):
  with pytest.raises(data.DataError, match="does not exist"):
    sources.read_articles(tmp_path / "missing")
  with pytest.raises(data.DataError, match="no \\*.txt"):
    sources.read_articles(tmp_path)
  (tmp_path / "tech").mkdir()
  (tmp_path / "tech" / "001.txt").write_text("A story.\n")
  (tmp_path / "tech" / "002.txt").write_text("  \n")
  with pytest.raises(data.DataError, match="002.txt is empty"):
    sources.read_articles(tmp_path)


def test_lm1b_text_layout(tmp_path):
  train_dir = tmp_path / sources.LM1B_TRAIN_DIR
  _write(train_dir / "news.en-00002-of-00100", ["b one .", "a shared sentence .", "b one ."])
  _write(train_dir / "news.en-00001-of-00100", ["a one .", "a two ."])
  _write(
    tmp_path / sources.LM1B_HELDOUT_DIR / "news.en.heldout-00000-of-00050",
    ["a shared sentence .", "h one ."],
  )
  split = data.read_source(data.DataConfig(source="lm1b_text", path=str(tmp_path)))
  assert split.train == ["a one .", "a two .", "b one ."]
  assert split.heldout == ["a shared sentence .", "h one ."]
  assert split.stats["heldout_in_train_dropped"] == 1


def test_lm1b_flat_directory_is_split_by_hash(tmp_path):
  lines = [f"sentence number {i} ." for i in range(400)]
  _write(tmp_path / "news.en-00001-of-00100", lines + lines[:10])
  config = data.DataConfig(source="lm1b_text", path=str(tmp_path), heldout_fraction=0.1)
  split = data.read_source(config)
  assert split.train == data.read_source(config).train
  assert sorted(split.train + split.heldout) == sorted(lines)
  assert 15 < len(split.heldout) < 70


def test_lm1b_errors(tmp_path):
  with pytest.raises(data.DataError, match="needs `path`"):
    data.read_source(data.DataConfig(source="lm1b_text"))
  with pytest.raises(data.DataError, match="does not exist"):
    data.read_source(data.DataConfig(source="lm1b_text", path=str(tmp_path / "nope")))
  with pytest.raises(data.DataError, match="no news.en-\\* files"):
    data.read_source(data.DataConfig(source="lm1b_text", path=str(tmp_path)))
  _write(tmp_path / "news.en-00001-of-00100", ["one sentence ."])
  (tmp_path / "news.en-00002-of-00100").write_text("\n\n")
  with pytest.raises(data.DataError, match="news.en-00002-of-00100 is empty"):
    data.read_source(data.DataConfig(source="lm1b_text", path=str(tmp_path)))


def test_tfds_without_tensorflow_datasets_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  with pytest.raises(data.DataError, match="tensorflow_datasets"):
    data.read_source(data.DataConfig(source="tfds"))


def test_tokenizer_round_trip_and_reserved_ids(dataset):
  tokenizer = dataset.tokenizer
  assert tokenizer.vocab_size == 512
  text = data.read_source(data.DataConfig(max_train_sentences=2000)).train
  for sentence in text[:200]:
    assert tokenizer.decode(tokenizer.encode(sentence)) == sentence
  ids = [data.BOS_ID, *tokenizer.encode("The market rose."), data.EOS_ID, data.PAD_ID]
  assert tokenizer.decode(ids) == "The market rose."
  assert (data.PAD_ID, data.UNK_ID, data.BOS_ID, data.EOS_ID) == (0, 1, 2, 3)


def test_tokenizer_training_is_deterministic(config):
  sentences = data.read_source(config).train[:500]
  small = dataclasses.replace(config, vocab_size=256)
  first = data.train_tokenizer(sentences, small)
  assert first.model_proto == data.train_tokenizer(sentences, small).model_proto


def test_tokenizer_vocab_mismatch(config, dataset, tmp_path):
  with pytest.raises(data.DataError, match="vocabulary has 512 entries but the model expects"):
    dataset.tokenizer.check_vocab(1024)
  sentences = data.read_source(config).train[:500]
  other = data.train_tokenizer(sentences, dataclasses.replace(config, vocab_size=256))
  path = tmp_path / "spm.model"
  other.save(path)
  with pytest.raises(data.DataError, match="vocabulary has 256 entries"):
    data.load_or_train_tokenizer(sentences, config, path)


def test_dataset_is_cached_and_in_range(config, dataset):
  again = data.load_dataset(config)
  np.testing.assert_array_equal(again.train.tokens, dataset.train.tokens)
  np.testing.assert_array_equal(again.heldout.offsets, dataset.heldout.offsets)
  assert len(dataset.train) == 2000
  assert dataset.train.tokens.min() > data.EOS_ID and dataset.train.tokens.max() < 512
  heldout = dataset.heldout.tokens
  assert heldout.max() < 512 and not np.isin(heldout, [data.PAD_ID, data.BOS_ID, data.EOS_ID]).any()


def test_pack_rows_keeps_sentences_whole():
  split = data.TokenizedSplit.from_ids([[10, 11], [12], [13, 14, 15, 16, 17, 18, 19], [20]])
  rows = data.pack_rows(split, np.array([0, 1, 2, 3]), seq_len=7)
  b, e = data.BOS_ID, data.EOS_ID
  np.testing.assert_array_equal(
    rows,
    [
      [b, 10, 11, e, b, 12, e, 0],
      [b, 13, 14, 15, 16, 17, 18, 19],
      [b, 20, e, 0, 0, 0, 0, 0],
    ],
  )


def test_train_batches_depend_only_on_seed_and_step(dataset):
  batches = data.TrainBatches(dataset.train, 32, 8, seed=3)
  steps = [0, 1, batches.steps_per_epoch, 5, batches.steps_per_epoch + 1, 5]
  first = [batches(s) for s in steps]
  fresh = data.TrainBatches(dataset.train, 32, 8, seed=3)
  for step, batch in zip(reversed(steps), reversed(first), strict=True):
    np.testing.assert_array_equal(fresh(step), batch)
  assert first[0].shape == (8, 33) and first[0].dtype == np.int32
  assert np.all(first[0][:, 0] == data.BOS_ID)
  assert not np.array_equal(first[0], data.TrainBatches(dataset.train, 32, 8, seed=4)(0))
  assert not np.array_equal(first[0], first[2])


def test_prompts_are_deterministic_heldout_prefixes(dataset):
  prompts = data.make_prompts(dataset.heldout, num_prompts=16, prompt_len=6, seed=1)
  again = data.make_prompts(dataset.heldout, num_prompts=16, prompt_len=6, seed=1)
  np.testing.assert_array_equal(prompts.tokens_BxP, again.tokens_BxP)
  other = data.make_prompts(dataset.heldout, num_prompts=16, prompt_len=6, seed=2)
  assert not np.array_equal(prompts.tokens_BxP, other.tokens_BxP)
  assert prompts.tokens_BxP.shape == (16, 7) and prompts.tokens_BxP.dtype == np.int32
  for row, length, index in zip(
    prompts.tokens_BxP, prompts.lengths_B, prompts.sentence_index_B, strict=True
  ):
    sentence = dataset.heldout.sentence(index)
    assert row[0] == data.BOS_ID and length == 1 + min(6, len(sentence))
    np.testing.assert_array_equal(row[1:length], sentence[: length - 1])
    assert np.all(row[length:] == data.PAD_ID)
  with pytest.raises(data.DataError, match="only"):
    data.make_prompts(dataset.heldout, num_prompts=10**6, prompt_len=6, seed=1)
