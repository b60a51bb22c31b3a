"""Open-weight pairs end to end: tokenizer, pair loading and restriction, the engine, sweeps.

The checkpoints are the tiny Hugging Face-layout ones of spectr_jax/testing/hf_checkpoints.py; the
model-level checks (logits against the float64 reference) are in tests/models/test_pretrained.py.
"""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm1b_spectr
from spectr_jax import engine, experiment, pairs, sampling, sweep_config
from spectr_jax.data import DataError, HFTokenizer
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import load_pretrained
from spectr_jax.pair_config import PairConfig
from spectr_jax.testing import hf_checkpoints
from tests import stats


def _pair_dirs(tmp_path, family, draft_rows=320, target_rows=336):
  """A draft and a target of `family` with one tokenizer and different embedding sizes."""
  dirs = []
  for role, seed, rows in (("draft", 0, draft_rows), ("target", 1, target_rows)):
    config = hf_checkpoints.tiny_config(family, vocab_size=rows)
    hf_checkpoints.write_checkpoint(tmp_path / role, family, config, seed=seed)
    dirs.append(tmp_path / role)
  return dirs


def test_tokenizer_reads_special_ids_and_round_trips(tmp_path):
  hf_checkpoints.write_checkpoint(tmp_path, "llama")
  tokenizer = HFTokenizer.load(tmp_path)
  assert tokenizer.vocab_size == hf_checkpoints.TOKENIZER_SIZE
  assert tokenizer.special.bos == hf_checkpoints.BOS_ID
  assert tokenizer.special.eos == (hf_checkpoints.EOS_ID, hf_checkpoints.EOT_ID)  # A list.
  text = "the lazy dog verifies 42 drafts"
  ids = tokenizer.encode(text)
  assert hf_checkpoints.BOS_ID not in ids and tokenizer.decode(ids) == text
  assert tokenizer.encode_batch([text, "fox"]) == [ids, tokenizer.encode("fox")]


def test_tokenizer_errors_name_the_directory(tmp_path):
  with pytest.raises(DataError, match="no tokenizer.json"):
    HFTokenizer.load(tmp_path)
  missing = tmp_path / "no-such-checkpoint"
  with pytest.raises(DataError, match=r"no-such-checkpoint is not a directory: .* local"):
    HFTokenizer.load(missing)
  with pytest.raises(FileNotFoundError, match=r"no-such-checkpoint is not a directory"):
    load_pretrained(missing)
  hf_checkpoints.write_checkpoint(tmp_path, "gpt2")
  config = json.loads((tmp_path / "config.json").read_text())
  for name in ("config.json", "generation_config.json"):
    values = json.loads((tmp_path / name).read_text())
    values["eos_token_id"] = None
    (tmp_path / name).write_text(json.dumps(values))
  with pytest.raises(DataError, match="no eos_token_id"):
    HFTokenizer.load(tmp_path)
  config["eos_token_id"] = 5000
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(DataError, match="not all below its vocabulary size"):
    HFTokenizer.load(tmp_path)


def test_pair_with_other_tokenizer_is_refused_naming_the_token(tmp_path):
  draft_dir, target_dir = _pair_dirs(tmp_path, "llama")
  path = target_dir / "tokenizer.json"
  spec = json.loads(path.read_text())
  vocab = spec["model"]["vocab"]
  a, b = (next(t for t, i in vocab.items() if i == n) for n in (270, 280))
  vocab[a], vocab[b] = 280, 270  # Same tokens and merges, two ids swapped.
  path.write_text(json.dumps(spec))
  with pytest.raises(ValueError, match=f"different tokenizers: id 270 is {a!r} in one and {b!r}"):
    pairs.load_pair(PairConfig("pretrained", str(draft_dir), str(target_dir)))


def test_pretrained_pair_is_restricted_to_the_tokenizer_and_reports_the_mass(tmp_path):
  draft_dir, target_dir = _pair_dirs(tmp_path, "qwen2")
  pair = pairs.load_pair(PairConfig("pretrained", str(draft_dir), str(target_dir)))
  n = hf_checkpoints.TOKENIZER_SIZE
  assert (pair.draft.config.vocab_size, pair.target.config.vocab_size) == (320, 336)
  assert pair.draft.config.num_logits == pair.target.config.num_logits == n
  # Random weights put real mass on the padding rows: 20 and 36 of 320 and 336 rows.
  assert 0.01 < pair.description["draft_dropped_mass"] < 0.3
  assert 0.01 < pair.description["target_dropped_mass"] < 0.3
  assert pair.special.eos == (hf_checkpoints.EOS_ID, hf_checkpoints.EOT_ID)
  assert pair.heldout.tokens.max() < n and len(pair.heldout) > 100
  with pytest.raises(ValueError, match="more than the model's 320 embedding rows"):
    pairs.restrict(pair.draft, 400)


# Gemma 2 (windows, soft-caps), GPT-2 (learned positions) and Llama (rope scaling); every
# family's cache path is checked against its full forward in tests/models/test_pretrained.py.
@pytest.mark.parametrize(
  "family",
  [
    "gemma2",
    pytest.param("gpt2", marks=pytest.mark.slow),
    pytest.param("llama", marks=pytest.mark.slow),
  ],
)
def test_greedy_spectr_on_a_loaded_pair_equals_greedy_target(tmp_path, family):
  draft_dir, target_dir = _pair_dirs(tmp_path, family)
  pair = pairs.load_pair(PairConfig("pretrained", str(draft_dir), str(target_dir)))
  prompts = jnp.asarray(np.random.default_rng(0).integers(4, 300, (4, 5)), jnp.int32)
  kw = dict(target=pair.target, prompts=prompts, prompt_lengths=jnp.array([5, 3, 4, 1]))
  greedy = DecodeSpec(method="autoregressive", max_new_tokens=10, temperature=0.0)
  ar = engine.generate(jax.random.key(0), greedy, draft=None, **kw)
  spec = greedy.replace(method="kseq", num_drafts=2, draft_len=3)
  out = engine.generate(jax.random.key(1), spec, draft=pair.draft, **kw)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxT), np.asarray(ar.tokens_BxT))


V_LAW = 5  # Logits cut to 5 ids, so the law of 3 tokens has 125 outcomes.
PROMPT = (1, 7, 9, 4, 12)  # Longer than gemma2's window of 4 once 3 tokens follow.


def _law(bundle, seqs_ExT, full_ExW):
  """The (restricted) model's law of every 3-token continuation of PROMPT."""
  logits = bundle.model.apply({"params": bundle.params}, jnp.asarray(full_ExW))[:, 4:7]
  probs = np.asarray(sampling.transform_probs(logits, 1.0), np.float64)
  law = np.prod(np.take_along_axis(probs, seqs_ExT[:, :, None], axis=2)[:, :, 0], axis=1)
  return law / law.sum()


@pytest.mark.slow
@pytest.mark.execution_bound
def test_engine_is_exact_on_a_loaded_gemma2_pair(tmp_path):
  """K-SEQ (K = 3, L = 2) on a loaded Gemma-2 pair restricted to V_LAW tokens: the
  target's law over three tokens (the one-draft path on a loaded family is the greedy
  test's, above, and every method's law is the engine pair's, tests/decoding/test_engine_law.py)."""
  method, num_drafts = "kseq", 3
  draft_dir, target_dir = _pair_dirs(tmp_path, "gemma2")
  draft, target = (pairs.restrict(load_pretrained(d), V_LAW) for d in (draft_dir, target_dir))
  seqs = np.array(list(itertools.product(range(V_LAW), repeat=3)), np.int32)
  full = np.hstack([np.broadcast_to(np.array(PROMPT, np.int32), (len(seqs), 5)), seqs])
  law = _law(target, seqs, full)
  b = 20_000
  out = engine.generate(
    jax.random.key(3), DecodeSpec(method=method, num_drafts=num_drafts, draft_len=2,
    max_new_tokens=3), draft=draft, target=target,
    prompts=jnp.tile(jnp.asarray([PROMPT], jnp.int32), (b, 1)), prompt_lengths=jnp.full((b,), 5),
  )  # fmt: skip
  codes = np.asarray(out.tokens_BxT) @ (V_LAW ** np.arange(3)[::-1])
  counts = np.bincount(codes, minlength=law.size)
  stats.assert_law(counts, law, f"{method} on a loaded gemma2 pair")
  # The broken variant, a sampler that returned the draft's law, is rejected.
  stats.assert_rejects(counts, _law(draft, seqs, full), f"{method}: draft law")


@pytest.mark.slow
def test_sweep_on_a_pretrained_pair_trains_nothing(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECTR_WORKDIR", str(tmp_path / "work"))
  draft_dir, target_dir = _pair_dirs(tmp_path, "llama")
  arg = f"test,pair=pretrained,draft_dir={draft_dir},target_dir={target_dir}"
  c = lm1b_spectr.get_config(arg)
  c.methods, c.num_drafts, c.seeds = ("autoregressive", "kseq"), (2,), (0,)
  sweep = sweep_config.SweepConfig.from_dict(c.to_dict())
  assert sweep.pair.kind == "pretrained" and sweep.pair.max_len == 0
  records = experiment.run_sweep(sweep)
  assert [r["cell"]["method"] for r in records] == ["autoregressive", "kseq"]
  assert all(r["block_efficiency"] >= 1 for r in records)
  made = sorted(p.name for p in (tmp_path / "work").iterdir())
  assert "draft" not in made and "target" not in made, made  # No training run was started.
