"""The independent side of the checkpoint-loader tests: fixtures and references checked.

The tiny checkpoints (spectr_jax/testing/hf_checkpoints.py) must be in the Hugging Face
layout and reach the regimes where each family detail matters; the float64 reference
(tests/hf_reference.py) must be causal and agree with a differently written token-by-
token computation.
"""

import json
import math

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

from configs import pretrained as published
from spectr_jax.testing import hf_checkpoints as hc
from tests import hf_reference as hr

T = 12
REL = 1e-3  # a dropped feature must move the logits by more than this (10x the loader's 1e-4)


def _tokens(b=2, t=T, seed=1):
  return np.random.default_rng(seed).integers(0, hc.TOKENIZER_SIZE, (b, t))


def _rel(a, b):
  return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """{family: (directory, config, weights)} of the default tiny float32 checkpoints."""
  out = {}
  for family in hc.FAMILIES:
    directory = tmp_path_factory.mktemp(family)
    config = hc.tiny_config(family)
    out[family] = directory, config, hc.write_checkpoint(directory, family, config)
  return out


@pytest.mark.parametrize("family,feature", [(f, x) for f in hc.FAMILIES for x in hr.FEATURES[f]])
def test_dropping_a_feature_changes_the_logits(checkpoints, family, feature):
  _, config, weights = checkpoints[family]
  base = hr.forward(family, config, weights, _tokens())
  assert base.shape == (2, T, config["vocab_size"])
  assert _rel(hr.forward(family, config, weights, _tokens(), drop=feature), base) > REL


def test_unknown_drop_and_family_are_refused(checkpoints):
  _, config, weights = checkpoints["llama"]
  with pytest.raises(ValueError, match="qkv_bias"):
    hr.forward("llama", config, weights, _tokens(), drop="qkv_bias")
  with pytest.raises(ValueError, match="mixtral"):
    hr.forward("mixtral", config, weights, _tokens())


def test_tiny_configs_reach_the_regimes(checkpoints):
  """llama3 rope: kept, blended and divided frequencies; gemma2: caps clip, window < T."""
  config = hc.tiny_config("llama")
  plain, scaled = hr.rope_inv_freq(config, scaled=False), hr.rope_inv_freq(config)
  factor = config["rope_scaling"]["factor"]
  kept = np.isclose(scaled, plain)
  divided = np.isclose(scaled, plain / factor)
  assert kept.any() and divided.any() and (~kept & ~divided).any()
  g2 = hc.tiny_config("gemma2")
  assert g2["sliding_window"] < T and g2["query_pre_attn_scalar"] != g2["head_dim"]
  gemma = hc.tiny_config("gemma")
  assert gemma["head_dim"] * gemma["num_attention_heads"] != gemma["hidden_size"]
  for family in ("llama", "qwen2", "gemma2"):
    c = hc.tiny_config(family)
    assert c["num_key_value_heads"] < c["num_attention_heads"]
  # the final cap clips: uncapped logits reach past the cap
  _, config, weights = checkpoints["gemma2"]
  raw = hr.forward("gemma2", config, weights, _tokens(), drop="final_softcap")
  assert np.abs(raw).max() > config["final_logit_softcapping"]


def test_llama_layout_single_file(tmp_path):
  config = hc.tiny_config("llama")
  weights = hc.write_checkpoint(tmp_path, "llama", config)
  stored = load_file(str(tmp_path / "model.safetensors"))
  assert set(stored) == set(weights)
  expected = {
    "model.embed_tokens.weight": (320, 32),
    "model.layers.1.self_attn.q_proj.weight": (32, 32),
    "model.layers.1.self_attn.k_proj.weight": (16, 32),
    "model.layers.1.self_attn.v_proj.weight": (16, 32),
    "model.layers.1.self_attn.o_proj.weight": (32, 32),
    "model.layers.1.mlp.gate_proj.weight": (64, 32),
    "model.layers.1.mlp.up_proj.weight": (64, 32),
    "model.layers.1.mlp.down_proj.weight": (32, 64),
    "model.layers.1.input_layernorm.weight": (32,),
    "model.layers.1.post_attention_layernorm.weight": (32,),
    "model.norm.weight": (32,),
    "lm_head.weight": (320, 32),
  }
  assert len(stored) == 3 + 9 * 2
  for name, shape in expected.items():
    assert stored[name].shape == shape and stored[name].dtype == np.float32, name
  for name, value in stored.items():
    np.testing.assert_array_equal(value.astype(np.float64), weights[name])
  assert not any("bias" in n or "rotary" in n for n in stored)
  written = json.loads((tmp_path / "config.json").read_text())
  assert written["torch_dtype"] == "float32" and written["rope_scaling"]["rope_type"] == "llama3"


@pytest.mark.parametrize(
  "family,names",
  [
    (
      "qwen2",
      {
        "model.layers.0.self_attn.q_proj.bias": (32,),
        "model.layers.0.self_attn.k_proj.bias": (16,),
        "model.layers.0.self_attn.v_proj.bias": (16,),
      },
    ),
    (
      "gemma",
      {
        "model.layers.0.self_attn.q_proj.weight": (64, 32),
        "model.layers.0.self_attn.k_proj.weight": (16, 32),
        "model.layers.0.self_attn.o_proj.weight": (32, 64),
      },
    ),
    (
      "gemma2",
      {
        "model.layers.1.pre_feedforward_layernorm.weight": (32,),
        "model.layers.1.post_feedforward_layernorm.weight": (32,),
        "model.layers.1.post_attention_layernorm.weight": (32,),
        "model.layers.1.self_attn.k_proj.weight": (32, 32),
      },
    ),
    (
      "gpt2",
      {
        "wte.weight": (320, 32),
        "wpe.weight": (64, 32),
        "h.1.ln_1.bias": (32,),
        "h.1.attn.c_attn.weight": (32, 96),
        "h.1.attn.c_attn.bias": (96,),
        "h.1.attn.c_proj.weight": (32, 32),
        "h.1.mlp.c_fc.weight": (32, 128),
        "h.1.mlp.c_proj.weight": (128, 32),
        "ln_f.bias": (32,),
      },
    ),
  ],
)
def test_family_layouts(checkpoints, family, names):
  directory, config, weights = checkpoints[family]
  stored = load_file(str(directory / "model.safetensors"))
  assert set(stored) == set(weights) and "lm_head.weight" not in stored  # all tied
  for name, shape in names.items():
    assert stored[name].shape == shape, name
  if family.startswith("gemma"):
    # the (1 + w) norms store w near 0; qwen2 biases are non-zero
    assert np.abs(weights["model.norm.weight"]).mean() < 0.3
  if family == "qwen2":
    assert np.abs(weights["model.layers.0.self_attn.q_proj.bias"]).min() > 0


def test_sharded_bf16_index_maps_every_tensor(tmp_path):
  single = hc.write_checkpoint(tmp_path / "one", "gemma2", dtype="bfloat16")
  weights = hc.write_checkpoint(tmp_path / "three", "gemma2", dtype="bfloat16", num_shards=3)
  index = json.loads((tmp_path / "three" / "model.safetensors.index.json").read_text())
  files = sorted(set(index["weight_map"].values()))
  assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
  assert not (tmp_path / "three" / "model.safetensors").exists()
  assert set(index["weight_map"]) == set(weights) == set(single)
  total = 0
  for file in files:
    stored = load_file(str(tmp_path / "three" / file))
    assert {n for n, f in index["weight_map"].items() if f == file} == set(stored)
    for name, value in stored.items():
      assert value.dtype == ml_dtypes.bfloat16, name
      np.testing.assert_array_equal(value.astype(np.float64), weights[name])
      np.testing.assert_array_equal(weights[name], single[name])
      total += value.nbytes
  assert index["metadata"]["total_size"] == total
  # the reference takes the stored bf16 arrays as they load
  loaded = {}
  for file in files:
    loaded.update(load_file(str(tmp_path / "three" / file)))
  np.testing.assert_array_equal(
    hr.forward("gemma2", hc.tiny_config("gemma2"), loaded, _tokens()),
    hr.forward("gemma2", hc.tiny_config("gemma2"), weights, _tokens()),
  )
  config = json.loads((tmp_path / "three" / "config.json").read_text())
  assert config["torch_dtype"] == "bfloat16"
  # the values returned are the rounded ones: bf16-exact, and not the float32 draw
  f32 = hc.write_checkpoint(tmp_path / "f32", "gemma2", tokenizer=False)
  embed = weights["model.embed_tokens.weight"]
  assert np.array_equal(embed.astype(ml_dtypes.bfloat16).astype(np.float64), embed)
  assert not np.array_equal(embed, f32["model.embed_tokens.weight"])
  np.testing.assert_allclose(embed, f32["model.embed_tokens.weight"], rtol=2**-8)


def test_gpt2_prefix_buffers_and_redundant_head(checkpoints, tmp_path):
  _, config, plain = checkpoints["gpt2"]
  weights = hc.write_checkpoint(
    tmp_path, "gpt2", prefix="transformer.", buffers=True, redundant_lm_head=True
  )
  stored = load_file(str(tmp_path / "model.safetensors"))
  assert set(stored) == set(weights)
  assert "transformer.h.0.attn.c_attn.weight" in stored and "h.0.attn.c_attn.weight" not in stored
  assert stored["transformer.h.1.attn.bias"].shape == (1, 1, 64, 64)
  assert stored["transformer.h.1.attn.masked_bias"].shape == ()
  np.testing.assert_array_equal(stored["lm_head.weight"], stored["transformer.wte.weight"])
  np.testing.assert_array_equal(weights["transformer.wte.weight"], plain["wte.weight"])
  tokens = _tokens()
  np.testing.assert_array_equal(
    hr.forward("gpt2", config, weights, tokens), hr.forward("gpt2", config, plain, tokens)
  )


def test_llama_tied_buffers_extra_and_drop(tmp_path):
  config = hc.tiny_config("llama", tie_word_embeddings=True)
  weights = hc.write_checkpoint(tmp_path / "a", "llama", config, buffers=True)
  assert "lm_head.weight" not in weights
  np.testing.assert_allclose(
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"],
    hr.rope_inv_freq(config, scaled=False),
    rtol=1e-6,
  )
  weights = hc.write_checkpoint(
    tmp_path / "b",
    "llama",
    config,
    redundant_lm_head=True,
    extra_tensors={"model.layers.0.mlp.surprise.weight": np.ones((2, 3))},
    drop_tensors=("model.layers.1.mlp.up_proj.weight",),
  )
  stored = load_file(str(tmp_path / "b" / "model.safetensors"))
  np.testing.assert_array_equal(stored["lm_head.weight"], stored["model.embed_tokens.weight"])
  assert stored["model.layers.0.mlp.surprise.weight"].dtype == np.float32
  assert "model.layers.1.mlp.up_proj.weight" not in stored and set(stored) == set(weights)
  with pytest.raises(ValueError, match="not_a_tensor"):
    hc.write_checkpoint(tmp_path / "c", "llama", drop_tensors=("not_a_tensor",))


@pytest.mark.parametrize("name", list(published.HUB_SHAPES))
def test_hub_shapes_have_the_published_parameter_counts(name):
  family, config = published.hub_config(name)
  assert hc.parameter_count(family, config) == published.HUB_SHAPES[name][2]


def test_absent_tie_key_follows_transformers_defaults():
  for family, untied in (("llama", True), ("qwen2", True), ("gemma", False), ("gemma2", False)):
    config = hc.tiny_config(family)
    del config["tie_word_embeddings"]
    assert ("lm_head.weight" in hc.tensor_shapes(family, config)) == untied, family


def test_tokenizer_and_generation_config(checkpoints):
  directory, config, _ = checkpoints["llama"]
  tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
  assert tokenizer.get_vocab_size() == hc.TOKENIZER_SIZE < config["vocab_size"]
  for i, token in enumerate(hc.SPECIAL_TOKENS):
    assert tokenizer.token_to_id(token) == i
  byte_ids = [tokenizer.token_to_id(c) for c in ByteLevel.alphabet()]
  assert sorted(byte_ids) == list(range(len(hc.SPECIAL_TOKENS), len(hc.SPECIAL_TOKENS) + 256))
  for text in ("the quick brown fox, 1234!", "Héllo wörld ✓ — déjà vu\n\ttabs"):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert max(ids) < hc.TOKENIZER_SIZE and tokenizer.decode(ids) == text
  assert len(tokenizer.encode("the quick brown fox").ids) < len("the quick brown fox")
  gen = json.loads((directory / "generation_config.json").read_text())
  assert gen["bos_token_id"] == hc.BOS_ID and gen["eos_token_id"] == [hc.EOS_ID, hc.EOT_ID]
  gpt2 = json.loads((checkpoints["gpt2"][0] / "generation_config.json").read_text())
  assert gpt2["eos_token_id"] == hc.EOS_ID


def test_a_pair_shares_one_tokenizer(tmp_path):
  """Two checkpoints with different embedding sizes get the same tokenizer.json bytes."""
  hc.write_checkpoint(tmp_path / "draft", "qwen2", hc.tiny_config("qwen2", num_hidden_layers=1))
  big = hc.tiny_config("qwen2", vocab_size=336, tie_word_embeddings=False)
  weights = hc.write_checkpoint(tmp_path / "target", "qwen2", big, seed=1)
  assert weights["lm_head.weight"].shape == (336, 32)
  draft, target = ((tmp_path / n / "tokenizer.json").read_bytes() for n in ("draft", "target"))
  assert draft == target
  assert hc.write_checkpoint(tmp_path / "none", "gpt2", return_weights=False) == {}


@pytest.mark.parametrize("family", hc.FAMILIES)
def test_reference_is_causal(checkpoints, family):
  _, config, weights = checkpoints[family]
  a = _tokens(1, T, seed=2)
  b = a.copy()
  b[:, 7:] = (b[:, 7:] + 5) % hc.TOKENIZER_SIZE
  la, lb = hr.forward(family, config, weights, a), hr.forward(family, config, weights, b)
  np.testing.assert_allclose(la[:, :7], lb[:, :7], rtol=1e-12, atol=1e-12)
  assert _rel(la[:, 7:], lb[:, 7:]) > REL


def _llama_step_by_step(config, w, tokens):
  """Llama decoded one token at a time with a KV cache, RoPE as complex rotations."""
  d, h, hkv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
  dh, eps = config["head_dim"], config["rms_norm_eps"]
  rs = config["rope_scaling"]
  freqs = []
  for i in range(dh // 2):
    f = config["rope_theta"] ** (-2 * i / dh)
    ratio = rs["original_max_position_embeddings"] * f / (2 * math.pi)  # orig / wavelength
    if ratio < rs["low_freq_factor"]:
      f /= rs["factor"]
    elif ratio <= rs["high_freq_factor"]:
      s = (ratio - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
      f = s * f + (1 - s) * f / rs["factor"]
    freqs.append(f)

  def rms(x, g):
    return g * x / math.sqrt(float(np.dot(x, x)) / d + eps)

  def rotate(x, pos):  # halves as real and imaginary parts
    z = (x[: dh // 2] + 1j * x[dh // 2 :]) * np.exp(1j * pos * np.array(freqs))
    return np.concatenate([z.real, z.imag])

  layers = config["num_hidden_layers"]
  cache = [([], []) for _ in range(layers)]
  out = []
  for pos, token in enumerate(tokens):
    x = w["model.embed_tokens.weight"][token].copy()
    for i in range(layers):
      p = f"model.layers.{i}."
      y = rms(x, w[p + "input_layernorm.weight"])
      q = w[p + "self_attn.q_proj.weight"] @ y
      k = w[p + "self_attn.k_proj.weight"] @ y
      v = w[p + "self_attn.v_proj.weight"] @ y
      keys, values = cache[i]
      keys.append([rotate(k[j * dh : (j + 1) * dh], pos) for j in range(hkv)])
      values.append([v[j * dh : (j + 1) * dh] for j in range(hkv)])
      heads = []
      for j in range(h):
        g = j * hkv // h
        qj = rotate(q[j * dh : (j + 1) * dh], pos)
        s = np.array([qj @ kk[g] for kk in keys]) / math.sqrt(dh)
        e = np.exp(s - s.max())
        heads.append(sum(pi * vv[g] for pi, vv in zip(e / e.sum(), values, strict=True)))
      x = x + w[p + "self_attn.o_proj.weight"] @ np.concatenate(heads)
      y = rms(x, w[p + "post_attention_layernorm.weight"])
      gate = w[p + "mlp.gate_proj.weight"] @ y
      up = w[p + "mlp.up_proj.weight"] @ y
      x = x + w[p + "mlp.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * up)
    out.append(w["lm_head.weight"] @ rms(x, w["model.norm.weight"]))
  return np.stack(out)


def test_llama_reference_matches_step_by_step(checkpoints):
  _, config, weights = checkpoints["llama"]
  tokens = _tokens(1, T, seed=3)
  np.testing.assert_allclose(
    hr.forward("llama", config, weights, tokens)[0],
    _llama_step_by_step(config, weights, tokens[0]),
    rtol=1e-10,
    atol=1e-10,
  )


def test_gpt2_reference_matches_step_by_step(checkpoints):
  """GPT-2 one token at a time: heads by column slices of c_attn, positions from wpe."""
  _, config, w = checkpoints["gpt2"]
  d, h, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
  dh = d // h

  def ln(x, name):
    c = x - x.mean()
    return c / math.sqrt(float(c @ c) / d + eps) * w[name + ".weight"] + w[name + ".bias"]

  tokens = _tokens(1, T, seed=4)[0]
  keys = [[] for _ in range(config["n_layer"])]
  values = [[] for _ in range(config["n_layer"])]
  out = []
  for pos, token in enumerate(tokens):
    x = w["wte.weight"][token] + w["wpe.weight"][pos]
    for i in range(config["n_layer"]):
      p = f"h.{i}."
      y = ln(x, p + "ln_1")
      wq, wk, wv = (w[p + "attn.c_attn.weight"][:, j * d : (j + 1) * d] for j in range(3))
      bq, bk, bv = (w[p + "attn.c_attn.bias"][j * d : (j + 1) * d] for j in range(3))
      q = y @ wq + bq
      keys[i].append(y @ wk + bk)
      values[i].append(y @ wv + bv)
      att = np.zeros(d)
      for j in range(h):
        sl = slice(j * dh, (j + 1) * dh)
        s = np.array([q[sl] @ k[sl] for k in keys[i]]) / math.sqrt(dh)
        e = np.exp(s - s.max())
        att[sl] = sum(pi * v[sl] for pi, v in zip(e / e.sum(), values[i], strict=True))
      x = x + att @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
      u = ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
      u = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
      x = x + u @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    out.append(w["wte.weight"] @ ln(x, "ln_f"))
  np.testing.assert_allclose(
    hr.forward("gpt2", config, w, tokens[None])[0], np.stack(out), rtol=1e-10, atol=1e-10
  )
