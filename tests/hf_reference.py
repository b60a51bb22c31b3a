"""Float64 numpy reference forward passes of the Hugging Face open-weight families.

Written from each family's published equations (Llama / Llama 3.1, Qwen2, Gemma, Gemma 2,
GPT-2 papers and model cards, and the documented behaviour of the Hugging Face modeling
code), independently of spectr_jax: the loader's logits are checked against `forward`.
`forward(..., drop=name)` switches one detail off (the wrong-but-plausible model), so the
tests can show each detail changes the logits on the tiny configs.
"""

import math

import numpy as np

FEATURES: dict[str, tuple[str, ...]] = {
  # rope_scaling: plain RoPE frequencies; rotate_half: GPT-J interleaved pairs instead of
  # rotating the two halves; kv_group: query head h reads kv head h % Hkv instead of
  # h // (H / Hkv); untied_head: logits from the embedding instead of lm_head.
  "llama": ("rope_scaling", "rotate_half", "kv_group", "untied_head"),
  "qwen2": ("qkv_bias", "rotate_half", "kv_group"),
  # embed_scale: no sqrt(D) on the embeddings; norm_offset: RMSNorm scale w, not (1 + w);
  # geglu: SiLU gate (SwiGLU) instead of tanh-GELU. (Exact erf-GELU instead of tanh-GELU is
  # no feature: the two differ by < 5e-4 per activation, ~1e-4 relative in the logits.)
  "gemma": ("embed_scale", "norm_offset", "geglu"),
  # attn_softcap / final_softcap: no tanh caps; sliding_window: every layer global;
  # query_pre_attn_scalar: scores scaled by head_dim^-0.5; post_norms: no
  # post_attention_layernorm / post_feedforward_layernorm.
  "gemma2": (
    "embed_scale",
    "norm_offset",
    "geglu",
    "attn_softcap",
    "final_softcap",
    "sliding_window",
    "query_pre_attn_scalar",
    "post_norms",
    "kv_group",
  ),
  # learned_positions: no wpe; layernorm_bias: LayerNorms without their biases; qkv_split:
  # c_attn's output split per head (H, 3, Dh) instead of [q | k | v]; conv1d_layout:
  # attn.c_proj applied as a torch Linear (x @ W.T) instead of Conv1D (x @ W).
  "gpt2": ("learned_positions", "layernorm_bias", "qkv_split", "conv1d_layout"),
}


def gelu_tanh(x: np.ndarray) -> np.ndarray:
  """The tanh approximation of GELU (GPT-2's gelu_new, Gemma's gelu_pytorch_tanh)."""
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
  """x * sigmoid(x) (SwiGLU's gate)."""
  return x / (1.0 + np.exp(-x))


def rope_inv_freq(config: dict, *, scaled: bool = True) -> np.ndarray:
  """RoPE inverse frequencies theta^(-2i/Dh), i < Dh/2, with llama3 scaling when configured.

  Llama 3.1 scaling: wavelength 2 pi / f; f / factor where the wavelength exceeds
  orig / low_freq_factor; f kept below orig / high_freq_factor; in between the blend
  (1 - s) f / factor + s f with s = (orig / wavelength - low) / (high - low).

  Args:
    config: the config.json dict (rope_theta, head_dim or hidden_size / heads, rope_scaling).
    scaled: apply rope_scaling (False: the plain frequencies).
  Returns:
    (Dh/2,) float64.
  """
  dh = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
  inv = config.get("rope_theta", 10000.0) ** (-np.arange(0, dh, 2, dtype=np.float64) / dh)
  rs = config.get("rope_scaling")
  if not scaled or not rs:
    return inv
  kind = rs.get("rope_type", rs.get("type"))
  if kind != "llama3":
    raise NotImplementedError(f"rope_scaling type {kind!r}")
  factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
  orig = rs["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv
  smooth = (orig / wavelen - low) / (high - low)
  blended = (1 - smooth) * inv / factor + smooth * inv
  out = np.where(wavelen > orig / low, inv / factor, blended)
  return np.where(wavelen < orig / high, inv, out)


def _rms_norm(x, w, eps, offset):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def _layer_norm(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(s):
  s = s - s.max(-1, keepdims=True)
  e = np.exp(s)
  return e / e.sum(-1, keepdims=True)


def _rope(x_BxTxHxDh, inv_freq, interleaved):
  t = x_BxTxHxDh.shape[1]
  ang = np.arange(t, dtype=np.float64)[:, None] * inv_freq[None, :]  # T x Dh/2
  cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
  if interleaved:
    x1, x2 = x_BxTxHxDh[..., 0::2], x_BxTxHxDh[..., 1::2]
    out = np.empty_like(x_BxTxHxDh)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out
  half = x_BxTxHxDh.shape[-1] // 2
  x1, x2 = x_BxTxHxDh[..., :half], x_BxTxHxDh[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _attend(q_BxTxHxDh, k_BxTxHxDh, v_BxTxHxDh, scale, softcap=None, window=None):
  """Causal attention; q, k, v already per query head. Returns B x T x H x Dh."""
  t = q_BxTxHxDh.shape[1]
  s = np.einsum("bqhd,bkhd->bhqk", q_BxTxHxDh, k_BxTxHxDh) * scale
  if softcap is not None:
    s = np.tanh(s / softcap) * softcap
  qpos, kpos = np.arange(t)[:, None], np.arange(t)[None, :]
  visible = kpos <= qpos
  if window is not None:
    visible &= qpos - kpos < window
  s = np.where(visible, s, -np.inf)
  return np.einsum("bhqk,bkhd->bqhd", _softmax(s), v_BxTxHxDh)


def _decoder(family, config, w, tokens, drop):
  """Llama / Qwen2 / Gemma / Gemma 2: pre-norm decoder with RMSNorm, gated MLP, GQA, RoPE."""
  d, h = config["hidden_size"], config["num_attention_heads"]
  hkv = config.get("num_key_value_heads") or h
  dh = config.get("head_dim") or d // h
  eps = config["rms_norm_eps"]
  gemma = family in ("gemma", "gemma2")
  offset = 1.0 if gemma and drop != "norm_offset" else 0.0
  if family == "qwen2" and config.get("use_sliding_window"):
    raise NotImplementedError("qwen2 use_sliding_window")
  activation = config.get("hidden_activation") or config.get("hidden_act")
  if activation not in (("gelu_pytorch_tanh", "gelu") if gemma else ("silu",)):
    raise NotImplementedError(f"{family} activation {activation!r}")
  embed = w["model.embed_tokens.weight"]
  x = embed[tokens]
  if gemma and drop != "embed_scale":
    x = x * math.sqrt(d)
  inv_freq = rope_inv_freq(config, scaled=drop != "rope_scaling")
  kv_of_head = np.arange(h) % hkv if drop == "kv_group" else np.arange(h) // (h // hkv)
  if family == "gemma2" and drop != "query_pre_attn_scalar":
    scale = config["query_pre_attn_scalar"] ** -0.5
  else:
    scale = dh**-0.5
  act = gelu_tanh if gemma and drop != "geglu" else silu
  b_, t = tokens.shape

  def norm(y, name):
    return _rms_norm(y, w[name], eps, offset)

  def linear(y, name, bias=True):
    out = y @ w[name + ".weight"].T
    if bias and name + ".bias" in w:
      out = out + w[name + ".bias"]
    return out

  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    y = norm(x, p + "input_layernorm.weight")
    with_bias = drop != "qkv_bias"
    q = linear(y, p + "self_attn.q_proj", with_bias).reshape(b_, t, h, dh)
    k = linear(y, p + "self_attn.k_proj", with_bias).reshape(b_, t, hkv, dh)
    v = linear(y, p + "self_attn.v_proj", with_bias).reshape(b_, t, hkv, dh)
    interleaved = drop == "rotate_half"
    q, k = _rope(q, inv_freq, interleaved), _rope(k, inv_freq, interleaved)
    softcap = window = None
    if family == "gemma2":
      if drop != "attn_softcap":
        softcap = config.get("attn_logit_softcapping")
      if i % 2 == 0 and drop != "sliding_window":
        window = config["sliding_window"]
    o = _attend(q, k[:, :, kv_of_head], v[:, :, kv_of_head], scale, softcap, window)
    a = linear(o.reshape(b_, t, h * dh), p + "self_attn.o_proj")
    if family == "gemma2" and drop != "post_norms":
      a = norm(a, p + "post_attention_layernorm.weight")
    x = x + a
    pre_mlp = "pre_feedforward_layernorm" if family == "gemma2" else "post_attention_layernorm"
    y = norm(x, p + pre_mlp + ".weight")
    gate = act(linear(y, p + "mlp.gate_proj"))
    m = linear(gate * linear(y, p + "mlp.up_proj"), p + "mlp.down_proj")
    if family == "gemma2" and drop != "post_norms":
      m = norm(m, p + "post_feedforward_layernorm.weight")
    x = x + m
  x = norm(x, "model.norm.weight")
  # transformers' defaults when the key is absent: Llama / Qwen2 untied, Gemma tied
  tied = config.get("tie_word_embeddings", gemma) or drop == "untied_head"
  logits = x @ (embed if tied else w["lm_head.weight"]).T
  cap = config.get("final_logit_softcapping") if family == "gemma2" else None
  if cap is not None and drop != "final_softcap":
    logits = np.tanh(logits / cap) * cap
  return logits


def _gpt2(config, w, tokens, drop):
  """GPT-2: learned positions, pre-LayerNorm, fused Conv1D qkv, gelu_new MLP, tied output."""
  d, h = config["n_embd"], config["n_head"]
  dh, eps = d // h, config["layer_norm_epsilon"]
  if config.get("activation_function", "gelu_new") != "gelu_new":
    raise NotImplementedError(config["activation_function"])
  b_, t = tokens.shape

  def ln(y, name):
    bias = w[name + ".bias"] if drop != "layernorm_bias" else 0.0
    return _layer_norm(y, w[name + ".weight"], bias, eps)

  def conv1d(y, name, transposed=False):
    weight = w[name + ".weight"]
    return y @ (weight.T if transposed else weight) + w[name + ".bias"]

  x = w["wte.weight"][tokens]
  if drop != "learned_positions":
    x = x + w["wpe.weight"][:t][None]
  for i in range(config["n_layer"]):
    p = f"h.{i}."
    qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
    if drop == "qkv_split":
      q, k, v = np.moveaxis(qkv.reshape(b_, t, h, 3, dh), 3, 0)
    else:
      q, k, v = (z.reshape(b_, t, h, dh) for z in np.split(qkv, 3, axis=-1))
    o = _attend(q, k, v, dh**-0.5).reshape(b_, t, d)
    x = x + conv1d(o, p + "attn.c_proj", transposed=drop == "conv1d_layout")
    m = gelu_tanh(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"))
    x = x + conv1d(m, p + "mlp.c_proj")
  return ln(x, "ln_f") @ w["wte.weight"].T


def forward(
  family: str,
  config: dict,
  weights: dict[str, np.ndarray],
  tokens_BxT,
  *,
  drop: str | None = None,
) -> np.ndarray:
  """The plain causal forward from position 0 of a Hugging Face checkpoint, in float64.

  Args:
    family: "llama", "qwen2", "gemma", "gemma2" or "gpt2".
    config: the config.json dict.
    weights: {HF tensor name: array} (GPT-2 names with or without "transformer."; buffers
      and other extra tensors are ignored).
    tokens_BxT: int token ids.
    drop: None, or one of FEATURES[family]: that detail switched off.
  Returns:
    B x T x V_embed float64 logits (every embedding row).
  """
  if family not in FEATURES:
    raise ValueError(f"unknown family {family!r}; expected one of {tuple(FEATURES)}")
  if drop is not None and drop not in FEATURES[family]:
    raise ValueError(f"drop={drop!r} not in FEATURES[{family!r}] = {FEATURES[family]}")
  tokens = np.asarray(tokens_BxT)
  w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
  if family == "gpt2":
    w = {k.removeprefix("transformer."): v for k, v in w.items()}
    return _gpt2(config, w, tokens, drop)
  return _decoder(family, config, w, tokens, drop)
