"""Independent NumPy reference for Hugging Face Llama and Mixtral causal language models.

This module loads a Hugging Face model folder (``config.json`` + ``model.safetensors``) and
computes next-token logits with the semantics of ``transformers``' ``LlamaForCausalLM`` and
``MixtralForCausalLM`` (files ``src/transformers/models/llama/modeling_llama.py`` and
``src/transformers/models/mixtral/modeling_mixtral.py``). It depends only on the standard
library and NumPy, so it can check another implementation without PyTorch.

All arithmetic is done in float64 (weights are widened from their stored dtype once, at load
time) and the logits are rounded to float32 at the very end. Hugging Face, running an FP32
checkpoint, computes in float32 throughout (including its RoPE cos/sin tables), so expect
agreement with it to float32 rounding noise, not bit for bit.

Usage:
    python3 hf_reference.py FOLDER --tokens 1,2,3 [--tokens 4,5]
        Prints ``{"logits": [L1, L2, ...]}``, one ``[T][V]`` nested list per ``--tokens``.
    python3 hf_reference.py --selftest
        Runs the built-in checks (see ``selftest``).
"""

import argparse
import json
import math
import os
import struct
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# The internal compute precision (see the module docstring).
COMPUTE_DTYPE = np.float64

# safetensors dtypes this reader understands: name -> (little-endian storage dtype, bytes).
_DTYPES = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # Raw bit patterns; widened by _bf16_to_f32.
}

# The reference safetensors implementation refuses headers larger than this.
_MAX_HEADER_BYTES = 100 * 1024 * 1024

_TENSOR_KEYS = {"dtype", "shape", "data_offsets"}


# --------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widens raw bfloat16 bit patterns (uint16) to float32 exactly."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Rounds float32 values to bfloat16 bit patterns (round to nearest even; finite input)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))
    return (rounded >> np.uint64(16)).astype(np.uint16)


def _reject_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """JSON object hook that refuses duplicate keys (a tensor name given twice)."""
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"safetensors header: duplicate entry for tensor {key!r}")
        out[key] = value
    return out


def _is_uint(value: Any) -> bool:
    """True for a non-negative JSON integer (bools excluded)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_safetensors_bytes(blob: bytes) -> Dict[str, np.ndarray]:
    """Parses an in-memory safetensors file; see ``load_safetensors``."""
    if len(blob) < 8:
        raise ValueError(f"safetensors: file is {len(blob)} bytes, shorter than the 8-byte "
                         "header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        raise ValueError(f"safetensors: header length {header_len} runs beyond the end of the "
                         f"file ({len(blob) - 8} bytes follow the length field)")
    if header_len > _MAX_HEADER_BYTES:
        raise ValueError(f"safetensors: header length {header_len} exceeds the "
                         f"{_MAX_HEADER_BYTES}-byte limit")
    try:
        header_text = blob[8:8 + header_len].decode("utf-8")
        header = json.loads(header_text, object_pairs_hook=_reject_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise ValueError(f"safetensors: header is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"safetensors: header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("safetensors: header is not a JSON object")

    buffer = memoryview(blob)[8 + header_len:]
    buffer_len = len(buffer)

    metadata = header.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("safetensors: __metadata__ must map strings to strings")

    # Validate every entry on its own first.
    entries = []  # (begin, end, name, dtype_name, shape)
    for name, info in header.items():
        if not isinstance(info, dict):
            raise ValueError(f"safetensors: entry for tensor {name!r} is not an object")
        if set(info) != _TENSOR_KEYS:
            raise ValueError(f"safetensors: tensor {name!r} has keys {sorted(info)}, expected "
                             f"{sorted(_TENSOR_KEYS)}")
        dtype_name = info["dtype"]
        if dtype_name not in _DTYPES:
            raise ValueError(f"safetensors: tensor {name!r} has unknown or unsupported dtype "
                             f"{dtype_name!r} (supported: {sorted(_DTYPES)})")
        shape = info["shape"]
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise ValueError(f"safetensors: tensor {name!r} has invalid shape {shape!r}")
        offsets = info["data_offsets"]
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_uint(o) for o in offsets)):
            raise ValueError(f"safetensors: tensor {name!r} has invalid data_offsets "
                             f"{offsets!r}")
        begin, end = offsets
        if begin > end:
            raise ValueError(f"safetensors: tensor {name!r} has data_offsets [{begin}, {end}] "
                             "with begin after end")
        if end > buffer_len:
            raise ValueError(f"safetensors: tensor {name!r} has data_offsets [{begin}, {end}] "
                             f"out of range of the {buffer_len}-byte data buffer")
        expected_bytes = math.prod(shape) * _DTYPES[dtype_name][1]
        if end - begin != expected_bytes:
            raise ValueError(f"safetensors: tensor {name!r} spans {end - begin} bytes but dtype "
                             f"{dtype_name} with shape {shape} needs {expected_bytes}")
        entries.append((begin, end, name, dtype_name, shape))

    # The tensors must tile the data buffer exactly: no overlap, no hole, nothing left over.
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    cursor = 0
    previous = None
    for begin, end, name, _, _ in entries:
        if begin < cursor:
            raise ValueError(f"safetensors: tensor {name!r} (bytes [{begin}, {end})) overlaps "
                             f"tensor {previous!r} (ends at {cursor})")
        if begin > cursor:
            raise ValueError(f"safetensors: hole in the data buffer: bytes [{cursor}, {begin}) "
                             f"before tensor {name!r} belong to no tensor")
        cursor = end
        previous = name
    if cursor != buffer_len:
        after = f"after tensor {previous!r}" if previous is not None else "(no tensors)"
        raise ValueError(f"safetensors: data buffer has {buffer_len - cursor} trailing bytes "
                         f"{after} that belong to no tensor")

    tensors: Dict[str, np.ndarray] = {}
    for begin, end, name, dtype_name, shape in entries:
        storage = _DTYPES[dtype_name][0]
        raw = np.frombuffer(buffer[begin:end], dtype=storage)
        if dtype_name == "BF16":
            values = _bf16_to_f32(raw)
        else:
            values = raw.astype(np.float32)
        tensors[name] = values.reshape(shape)
    return tensors


def load_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Loads a safetensors file into float32 NumPy arrays.

    The layout is: an 8-byte little-endian u64 header length N, N bytes of UTF-8 JSON header
    mapping tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an
    optional ``__metadata__`` string map), then the data buffer. Offsets are relative to the
    start of the buffer, and the tensors must cover it exactly, with no holes or overlaps.

    Args:
        path: File to read.

    Returns:
        Tensor name to float32 array (F32 copied, BF16 and F16 widened exactly).

    Raises:
        ValueError: The file is malformed; the message names the offending tensor where there
            is one.
    """
    with open(path, "rb") as handle:
        blob = handle.read()
    return parse_safetensors_bytes(blob)


def save_safetensors(path: str, tensors: Dict[str, np.ndarray], dtype: str = "F32",
                     metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes tensors to a safetensors file (used by the self-test to build fixtures).

    Args:
        path: File to write.
        tensors: Name to array.
        dtype: "F32", "F16" or "BF16" for every tensor.
        metadata: Optional ``__metadata__`` string map.
    """
    header: Dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    chunks = []
    offset = 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name], dtype=np.float32)
        if dtype == "F32":
            data = array.astype("<f4").tobytes()
        elif dtype == "F16":
            data = array.astype("<f2").tobytes()
        elif dtype == "BF16":
            data = _f32_to_bf16_bits(array).astype("<u2").tobytes()
        else:
            raise ValueError(f"unsupported dtype {dtype!r}")
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # Pad like the reference writer does.
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header_bytes)))
        handle.write(header_bytes)
        for chunk in chunks:
            handle.write(chunk)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}

# Hugging Face defaults for fields a config.json may omit (LlamaConfig / MixtralConfig).
_DEFAULTS = {
    "llama": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"},
    "mixtral": {"rms_norm_eps": 1e-5, "rope_theta": 1e6, "hidden_act": "silu",
                "num_local_experts": 8, "num_experts_per_tok": 2},
}


class Config:
    """The architecture hyper-parameters, resolved with Hugging Face defaults.

    Attributes:
        model_type: "llama" or "mixtral".
        vocab_size, hidden_size, intermediate_size, num_layers: Sizes.
        num_heads, num_kv_heads, head_dim: Attention geometry.
        rms_norm_eps, rope_theta: Norm epsilon and RoPE base.
        tie_word_embeddings: Whether the LM head reuses the embedding matrix.
        num_experts, experts_per_tok: Mixtral routing (0 for Llama).
        sliding_window: Mixtral attention window, or None for full causal attention.
    """

    def __init__(self, raw: Dict[str, Any]):
        """Validates a parsed config.json.

        Raises:
            ValueError: A field is missing, malformed or asks for an unsupported feature.
        """
        model_type = raw.get("model_type")
        if model_type not in _ARCHITECTURES:
            raise ValueError(f"config: model_type {model_type!r} is not 'llama' or 'mixtral'")
        self.model_type = model_type
        defaults = _DEFAULTS[model_type]

        architectures = raw.get("architectures")
        if architectures is not None and architectures != [_ARCHITECTURES[model_type]]:
            raise ValueError(f"config: architectures {architectures!r} do not match model_type "
                             f"{model_type!r} (expected [{_ARCHITECTURES[model_type]!r}])")

        def get_int(key: str, default: Optional[int] = None) -> int:
            value = raw.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config: {key} must be a positive integer, got {value!r}")
            return value

        def get_float(key: str) -> float:
            value = raw.get(key, defaults[key])
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config: {key} must be a positive number, got {value!r}")
            return float(value)

        self.vocab_size = get_int("vocab_size")
        self.hidden_size = get_int("hidden_size")
        self.intermediate_size = get_int("intermediate_size")
        self.num_layers = get_int("num_hidden_layers")
        self.num_heads = get_int("num_attention_heads")
        # LlamaConfig and MixtralConfig map an explicit null to num_attention_heads. When the
        # key is absent, LlamaConfig also uses num_attention_heads but MixtralConfig's own
        # default is 8.
        if raw.get("num_key_value_heads") is None:
            if model_type == "mixtral" and "num_key_value_heads" not in raw:
                self.num_kv_heads = 8
            else:
                self.num_kv_heads = self.num_heads
        else:
            self.num_kv_heads = get_int("num_key_value_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"config: num_attention_heads {self.num_heads} is not a multiple "
                             f"of num_key_value_heads {self.num_kv_heads}")
        if raw.get("head_dim") is None:
            self.head_dim = self.hidden_size // self.num_heads
        else:
            self.head_dim = get_int("head_dim")
        if self.head_dim % 2:
            raise ValueError(f"config: head_dim {self.head_dim} must be even for RoPE")

        self.rms_norm_eps = get_float("rms_norm_eps")
        self.rope_theta = self._rope_theta(raw, defaults["rope_theta"])

        hidden_act = raw.get("hidden_act", defaults["hidden_act"])
        if hidden_act != "silu":
            raise ValueError(f"config: hidden_act {hidden_act!r} is not supported (only 'silu')")
        for key in ("attention_bias", "mlp_bias"):
            if raw.get(key, False):
                raise ValueError(f"config: {key}=true is not supported (bias-free projections "
                                 "only)")
        factor = raw.get("partial_rotary_factor", 1.0)
        if factor != 1.0:
            raise ValueError(f"config: partial_rotary_factor {factor!r} is not supported")
        tie = raw.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise ValueError(f"config: tie_word_embeddings must be a boolean, got {tie!r}")
        self.tie_word_embeddings = tie

        self.num_experts = 0
        self.experts_per_tok = 0
        self.sliding_window = None
        if model_type == "mixtral":
            self.num_experts = get_int("num_local_experts", defaults["num_local_experts"])
            self.experts_per_tok = get_int("num_experts_per_tok",
                                           defaults["num_experts_per_tok"])
            if self.experts_per_tok > self.num_experts:
                raise ValueError(f"config: num_experts_per_tok {self.experts_per_tok} exceeds "
                                 f"num_local_experts {self.num_experts}")
            if raw.get("sliding_window") is not None:
                self.sliding_window = get_int("sliding_window")

    @staticmethod
    def _rope_theta(raw: Dict[str, Any], default: float) -> float:
        """Returns the RoPE base, refusing any RoPE scaling variant."""
        rope_scaling = raw.get("rope_scaling")
        if rope_scaling is not None:
            raise ValueError(f"config: rope_scaling {rope_scaling!r} is not supported (must be "
                             "null or absent)")
        theta = raw.get("rope_theta")
        # Newer configs may carry the base in rope_parameters; only the default type is allowed.
        params = raw.get("rope_parameters")
        if params is not None:
            if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
                raise ValueError(f"config: rope_parameters {params!r} is not supported (only "
                                 "rope_type 'default')")
            if theta is None:
                theta = params.get("rope_theta")
            elif params.get("rope_theta", theta) != theta:
                raise ValueError("config: rope_theta and rope_parameters.rope_theta disagree")
        if theta is None:
            theta = default
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
            raise ValueError(f"config: rope_theta must be a positive number, got {theta!r}")
        return float(theta)

    def expected_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """Returns every tensor name the checkpoint must hold, with its shape."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q_dim = self.num_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        shapes: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (v, d),
                                              "model.norm.weight": (d,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, d)
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (d,)
            shapes[p + "post_attention_layernorm.weight"] = (d,)
            shapes[p + "self_attn.q_proj.weight"] = (q_dim, d)
            shapes[p + "self_attn.k_proj.weight"] = (kv_dim, d)
            shapes[p + "self_attn.v_proj.weight"] = (kv_dim, d)
            shapes[p + "self_attn.o_proj.weight"] = (d, q_dim)
            if self.model_type == "llama":
                shapes[p + "mlp.gate_proj.weight"] = (f, d)
                shapes[p + "mlp.up_proj.weight"] = (f, d)
                shapes[p + "mlp.down_proj.weight"] = (d, f)
            else:
                shapes[p + "block_sparse_moe.gate.weight"] = (self.num_experts, d)
                for e in range(self.num_experts):
                    q = f"{p}block_sparse_moe.experts.{e}."
                    shapes[q + "w1.weight"] = (f, d)
                    shapes[q + "w3.weight"] = (f, d)
                    shapes[q + "w2.weight"] = (d, f)
        return shapes


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """HF RMSNorm: ``weight * (x * rsqrt(mean(x**2, -1) + eps))``."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU ``x * sigmoid(x)`` (``ACT2FN["silu"]``), safe for large negative inputs."""
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float) -> Tuple[np.ndarray,
                                                                             np.ndarray]:
    """HF default RoPE tables.

    ``inv_freq = 1 / theta ** (arange(0, head_dim, 2) / head_dim)``; the angles
    ``positions x inv_freq`` are concatenated with themselves (``cat((freqs, freqs))``), so
    dimension ``i`` and ``i + head_dim / 2`` share a frequency.

    Returns:
        (cos, sin), each [len(positions), head_dim].
    """
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    freqs = np.outer(positions.astype(np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """HF ``rotate_half``: ``cat((-x2, x1))`` over the two halves of the last axis."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """HF ``apply_rotary_pos_emb`` for one tensor: ``x * cos + rotate_half(x) * sin``.

    Args:
        x: [..., T, head_dim].
        cos, sin: [T, head_dim], broadcast over leading axes.
    """
    return x * cos + rotate_half(x) * sin


class Model:
    """A Llama or Mixtral causal LM held as float64 NumPy weights."""

    def __init__(self, config: Config, tensors: Dict[str, np.ndarray]):
        """Checks the tensors against the config and keeps float64 copies.

        Raises:
            ValueError: A tensor is missing, unexpected or of the wrong shape (named).
        """
        self.config = config
        expected = config.expected_shapes()
        tensors = dict(tensors)
        if config.tie_word_embeddings and "lm_head.weight" in tensors:
            # HF ignores a stored head when tied; accept it only if it is the same matrix.
            head = tensors.pop("lm_head.weight")
            embed = tensors.get("model.embed_tokens.weight")
            if embed is None or head.shape != embed.shape or not np.array_equal(head, embed):
                raise ValueError("tensor 'lm_head.weight' is present and differs from "
                                 "'model.embed_tokens.weight' although tie_word_embeddings=true")
        for name in sorted(expected):
            if name not in tensors:
                raise ValueError(f"missing tensor {name!r} (expected shape "
                                 f"{list(expected[name])})")
        for name in sorted(tensors):
            if name not in expected:
                raise ValueError(f"unexpected tensor {name!r} with shape "
                                 f"{list(np.shape(tensors[name]))}")
            if tuple(np.shape(tensors[name])) != expected[name]:
                raise ValueError(f"tensor {name!r} has shape {list(np.shape(tensors[name]))}, "
                                 f"expected {list(expected[name])}")
        self.w = {name: np.asarray(value, dtype=COMPUTE_DTYPE) for name, value in tensors.items()}
        self.embed = self.w["model.embed_tokens.weight"]
        self.lm_head = self.embed if config.tie_word_embeddings else self.w["lm_head.weight"]

    # -- blocks ---------------------------------------------------------------------------

    def _attention(self, i: int, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Causal self-attention of layer ``i`` on normed input ``x`` [T, D] (before residual)."""
        c = self.config
        p = f"model.layers.{i}.self_attn."
        t = x.shape[0]
        # nn.Linear is x @ W.T; q_proj output features are laid out head-major ([H, head_dim]).
        q = (x @ self.w[p + "q_proj.weight"].T).reshape(t, c.num_heads, c.head_dim)
        k = (x @ self.w[p + "k_proj.weight"].T).reshape(t, c.num_kv_heads, c.head_dim)
        v = (x @ self.w[p + "v_proj.weight"].T).reshape(t, c.num_kv_heads, c.head_dim)
        q = apply_rope(q.transpose(1, 0, 2), cos, sin)  # [H, T, hd]
        k = apply_rope(k.transpose(1, 0, 2), cos, sin)  # [KV, T, hd]
        v = v.transpose(1, 0, 2)
        # repeat_kv: query head h reads kv head h // (num_heads / num_kv_heads).
        n_rep = c.num_heads // c.num_kv_heads
        if n_rep > 1:
            k = np.repeat(k, n_rep, axis=0)
            v = np.repeat(v, n_rep, axis=0)
        scores = (q @ k.transpose(0, 2, 1)) * (c.head_dim ** -0.5)  # [H, T, T]
        q_idx = np.arange(t)[:, None]
        kv_idx = np.arange(t)[None, :]
        allowed = kv_idx <= q_idx
        if c.sliding_window is not None:
            # masking_utils.sliding_window_overlay: kv_idx > q_idx - sliding_window.
            allowed &= kv_idx > q_idx - c.sliding_window
        scores = np.where(allowed, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = (probs @ v).transpose(1, 0, 2).reshape(t, c.num_heads * c.head_dim)
        return out @ self.w[p + "o_proj.weight"].T

    def _mlp(self, i: int, x: np.ndarray) -> np.ndarray:
        """LlamaMLP: ``down(silu(gate(x)) * up(x))``."""
        p = f"model.layers.{i}.mlp."
        hidden = silu(x @ self.w[p + "gate_proj.weight"].T) * (x @ self.w[p + "up_proj.weight"].T)
        return hidden @ self.w[p + "down_proj.weight"].T

    def _expert(self, i: int, e: int, x: np.ndarray) -> np.ndarray:
        """MixtralBlockSparseTop2MLP: ``w2(silu(w1(x)) * w3(x))``."""
        p = f"model.layers.{i}.block_sparse_moe.experts.{e}."
        hidden = silu(x @ self.w[p + "w1.weight"].T) * (x @ self.w[p + "w3.weight"].T)
        return hidden @ self.w[p + "w2.weight"].T

    def route(self, i: int, x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """MixtralSparseMoeBlock routing for layer ``i``.

        ``softmax(gate(x))`` over all experts, top-k, then the k weights are renormalised to
        sum to one (``routing_weights /= routing_weights.sum(dim=-1, keepdim=True)``). Ties are
        broken towards the lower expert index.

        Returns:
            (experts [T, k] int, weights [T, k]) in descending weight order.
        """
        c = self.config
        logits = x @ self.w[f"model.layers.{i}.block_sparse_moe.gate.weight"].T  # [T, E]
        logits = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :c.experts_per_tok]
        weights = np.take_along_axis(probs, order, axis=-1)
        weights = weights / weights.sum(axis=-1, keepdims=True)
        return order, weights

    def _moe(self, i: int, x: np.ndarray) -> np.ndarray:
        """MixtralSparseMoeBlock: ``sum_k weight_k * expert_k(x)`` per token."""
        experts, weights = self.route(i, x)
        out = np.zeros_like(x)
        for e in range(self.config.num_experts):
            rows, slots = np.nonzero(experts == e)
            if rows.size:
                out[rows] += self._expert(i, e, x[rows]) * weights[rows, slots][:, None]
        return out

    # -- forward --------------------------------------------------------------------------

    def hidden_states(self, token_ids: Sequence[int]) -> np.ndarray:
        """Final-normed hidden states [T, D] (float64) for one sequence at positions 0..T-1."""
        c = self.config
        ids = self._check_ids(token_ids)
        x = self.embed[ids]
        cos, sin = rope_cos_sin(np.arange(len(ids)), c.head_dim, c.rope_theta)
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
            x = x + self._attention(i, h, cos, sin)
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            x = x + (self._mlp(i, h) if c.model_type == "llama" else self._moe(i, h))
        return rms_norm(x, self.w["model.norm.weight"], c.rms_norm_eps)

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits [T, V] as float32 (computed in float64) for one causal sequence."""
        return (self.hidden_states(token_ids) @ self.lm_head.T).astype(np.float32)

    def _check_ids(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = list(token_ids)
        if not ids:
            raise ValueError("token_ids is empty")
        for tok in ids:
            if (not isinstance(tok, (int, np.integer)) or isinstance(tok, bool)
                    or not 0 <= tok < self.config.vocab_size):
                raise ValueError(f"token id {tok!r} is not in [0, {self.config.vocab_size})")
        return np.asarray(ids, dtype=np.int64)


def build_model(config: Dict[str, Any], tensors: Dict[str, np.ndarray]) -> Model:
    """Builds a model from a parsed config.json dict and a tensor dict."""
    return Model(Config(config), tensors)


def load_model(folder: str) -> Model:
    """Loads ``folder/config.json`` and ``folder/model.safetensors``.

    Raises:
        ValueError: Unsupported config, malformed file, or tensors not matching the config.
    """
    with open(os.path.join(folder, "config.json"), "r", encoding="utf-8") as handle:
        raw = json.load(handle)
    if not isinstance(raw, dict):
        raise ValueError("config.json is not a JSON object")
    config = Config(raw)
    weights = os.path.join(folder, "model.safetensors")
    if not os.path.exists(weights):
        raise ValueError(f"{weights} not found (sharded checkpoints are not supported)")
    return Model(config, load_safetensors(weights))


# --------------------------------------------------------------------------------------------
# Self-test
# --------------------------------------------------------------------------------------------


def _random_tensors(config: Dict[str, Any], rng: np.random.Generator,
                    scale: float = 0.2) -> Dict[str, np.ndarray]:
    """Random float32 weights of the right shapes (norm weights near 1)."""
    out = {}
    for name, shape in Config(config).expected_shapes().items():
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out


def _llama_config(**overrides: Any) -> Dict[str, Any]:
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 37,
              "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}
    config.update(overrides)
    return config


def _expect_error(func, *needles: str) -> None:
    """Asserts that ``func()`` raises ValueError whose message contains every needle."""
    try:
        func()
    except ValueError as exc:
        for needle in needles:
            assert needle in str(exc), f"error {exc!r} does not mention {needle!r}"
        return
    raise AssertionError(f"expected ValueError mentioning {needles}")


def _raw_file(header: Dict[str, Any], data: bytes, header_len: Optional[int] = None) -> bytes:
    text = json.dumps(header).encode("utf-8")
    length = len(text) if header_len is None else header_len
    return struct.pack("<Q", length) + text + data


def _selftest_safetensors(tmp: str, rng: np.random.Generator) -> None:
    """Round trips and malformed-file rejections."""
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    path = os.path.join(tmp, "t.safetensors")
    save_safetensors(path, {"a": a, "b": b}, "F32", metadata={"format": "pt"})
    loaded = load_safetensors(path)
    assert set(loaded) == {"a", "b"} and loaded["a"].dtype == np.float32
    assert np.array_equal(loaded["a"], a) and np.array_equal(loaded["b"], b)

    save_safetensors(path, {"a": a}, "BF16")
    bf = load_safetensors(path)["a"]
    expected = _bf16_to_f32(_f32_to_bf16_bits(a))
    assert np.array_equal(bf, expected), "BF16 round trip"
    assert np.max(np.abs(bf - a) / np.abs(a)) <= 2.0 ** -8, "BF16 rounding error too large"
    # Known bit patterns: 0x3F80 = 1.0, 0xC000 = -2.0, 0x3EAA ~ 0.33203125.
    bits = np.array([0x3F80, 0xC000, 0x3EAA], dtype="<u2").tobytes()
    manual = parse_safetensors_bytes(_raw_file(
        {"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}, bits))["x"]
    assert manual.tolist() == [1.0, -2.0, 0.33203125], manual

    save_safetensors(path, {"a": a}, "F16")
    assert np.array_equal(load_safetensors(path)["a"], a.astype(np.float16).astype(np.float32))

    four = np.arange(4, dtype="<f4").tobytes()  # 16 bytes.
    ok = {"t0": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "t1": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    assert parse_safetensors_bytes(_raw_file(ok, four))["t1"].tolist() == [2.0, 3.0]

    def case(header, data=four, header_len=None):
        return lambda: parse_safetensors_bytes(_raw_file(header, data, header_len))

    _expect_error(case(ok, header_len=10 ** 6), "header length")
    _expect_error(lambda: parse_safetensors_bytes(b"\x01\x02"), "shorter")
    _expect_error(case({**ok, "t1": {"dtype": "F32", "shape": [3],
                                     "data_offsets": [8, 20]}}), "'t1'", "out of range")
    _expect_error(case({**ok, "t1": {"dtype": "F32", "shape": [2],
                                     "data_offsets": [4, 12]}}, four[:12] + four[:4]), "overlap")
    _expect_error(case({**ok, "t1": {"dtype": "F32", "shape": [1],
                                     "data_offsets": [8, 16]}}), "'t1'", "needs 4")
    _expect_error(case({**ok, "t1": {"dtype": "I64", "shape": [1],
                                     "data_offsets": [8, 16]}}), "'t1'", "dtype")
    _expect_error(case({"t0": ok["t0"], "t1": {"dtype": "F32", "shape": [1],
                                               "data_offsets": [12, 16]}}), "'t1'", "hole")
    _expect_error(case({"t0": ok["t0"]}), "'t0'", "trailing")
    _expect_error(case({**ok, "t1": {"dtype": "F32", "shape": [2],
                                     "data_offsets": [16, 8]}}), "'t1'", "begin after end")
    _expect_error(case({**ok, "t1": {"dtype": "F32", "shape": [-2],
                                     "data_offsets": [8, 16]}}), "'t1'", "shape")
    dup = (b'{"t0": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
           b'"t0": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}')
    _expect_error(lambda: parse_safetensors_bytes(struct.pack("<Q", len(dup)) + dup + four),
                  "'t0'", "duplicate")


def _selftest_rope() -> None:
    """RoPE convention and the relative-position property."""
    rng = np.random.default_rng(1)
    head_dim, theta = 8, 10000.0
    # Convention: dims i and i + head_dim/2 rotate together by angle pos * inv_freq[i].
    x = rng.standard_normal(head_dim)
    pos = 7
    cos, sin = rope_cos_sin(np.array([pos]), head_dim, theta)
    rotated = apply_rope(x[None, :], cos, sin)[0]
    half = head_dim // 2
    for i in range(half):
        angle = pos / theta ** (2 * i / head_dim)
        c, s = math.cos(angle), math.sin(angle)
        assert abs(rotated[i] - (x[i] * c - x[i + half] * s)) < 1e-12
        assert abs(rotated[i + half] - (x[i] * s + x[i + half] * c)) < 1e-12
    # Relative position: <rope(q, p), rope(k, p')> depends only on p - p'.
    q, k = rng.standard_normal(head_dim), rng.standard_normal(head_dim)
    positions = np.arange(64)
    cos, sin = rope_cos_sin(positions, head_dim, theta)
    rq = apply_rope(np.tile(q, (64, 1)), cos, sin)
    rk = apply_rope(np.tile(k, (64, 1)), cos, sin)
    scores = rq @ rk.T
    for delta in (0, 1, 5, 17):
        diag = np.array([scores[p + delta, p] for p in range(64 - delta)])
        assert np.max(np.abs(diag - diag[0])) < 1e-9, f"RoPE not relative at delta {delta}"
    assert abs(scores[1, 0] - scores[5, 0]) > 1e-6, "RoPE scores should vary with distance"


def _selftest_models(tmp: str, rng: np.random.Generator) -> None:
    """Loader checks, causality, GQA, tied embeddings and MoE against the dense MLP."""
    folder = os.path.join(tmp, "llama")
    os.makedirs(folder)
    config = _llama_config()
    tensors = _random_tensors(config, rng)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    save_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    model = load_model(folder)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    logits = model.logits(tokens)
    assert logits.shape == (8, 37) and logits.dtype == np.float32
    assert np.all(np.isfinite(logits))
    direct = build_model(config, tensors).logits(tokens)
    assert np.array_equal(logits, direct)

    # Causality: changing later tokens, or dropping them, leaves earlier logits unchanged.
    changed = model.logits(tokens[:5] + [30, 31, 32])
    assert np.allclose(changed[:5], logits[:5], rtol=0, atol=1e-6)
    assert not np.allclose(changed[5:], logits[5:], atol=1e-3), "later logits should change"
    prefix = model.logits(tokens[:3])
    assert np.allclose(prefix, logits[:3], rtol=0, atol=1e-6)
    h_full = model.hidden_states(tokens)
    h_changed = model.hidden_states(tokens[:5] + [30, 31, 32])
    assert np.max(np.abs(h_full[:5] - h_changed[:5])) < 1e-12

    # GQA: 2 kv heads shared by 4 query heads equals MHA with the kv rows repeated per
    # repeat_kv (query head h reads kv head h // 2).
    gqa_config = _llama_config(num_key_value_heads=2)
    gqa_tensors = _random_tensors(gqa_config, rng)
    mha_tensors = dict(gqa_tensors)
    hd = 16 // 4
    for i in range(2):
        for kind in ("k", "v"):
            name = f"model.layers.{i}.self_attn.{kind}_proj.weight"
            heads = gqa_tensors[name].reshape(2, hd, 16)
            mha_tensors[name] = np.repeat(heads, 2, axis=0).reshape(4 * hd, 16)
    gqa = build_model(gqa_config, gqa_tensors).logits(tokens)
    mha = build_model(_llama_config(), mha_tensors).logits(tokens)
    assert np.allclose(gqa, mha, rtol=0, atol=1e-6), "GQA disagrees with repeated-kv MHA"

    # Tied embeddings: no lm_head stored, the embedding matrix is used instead.
    tied_tensors = dict(tensors)
    del tied_tensors["lm_head.weight"]
    tied = build_model(_llama_config(tie_word_embeddings=True), tied_tensors).logits(tokens)
    untied_tensors = dict(tensors, **{"lm_head.weight": tensors["model.embed_tokens.weight"]})
    assert np.array_equal(tied, build_model(config, untied_tensors).logits(tokens))

    # Mixtral with identical experts equals the Llama MLP (needs the top-k renormalisation).
    moe_config = dict(config, model_type="mixtral", architectures=["MixtralForCausalLM"],
                      num_local_experts=4, num_experts_per_tok=2)
    moe_tensors = {}
    for name, value in tensors.items():
        for kind, w in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            if name.endswith(f"mlp.{kind}.weight"):
                layer = name[:-len(f"mlp.{kind}.weight")]
                for e in range(4):
                    moe_tensors[f"{layer}block_sparse_moe.experts.{e}.{w}.weight"] = value
                break
        else:
            moe_tensors[name] = value
    for i in range(2):
        moe_tensors[f"model.layers.{i}.block_sparse_moe.gate.weight"] = (
            rng.standard_normal((4, 16)).astype(np.float32))
    moe = build_model(moe_config, moe_tensors)
    assert np.allclose(moe.logits(tokens), logits, rtol=0, atol=1e-6), "MoE != dense MLP"

    # Mixtral with distinct experts: the block output matches a per-token brute force.
    distinct = dict(moe_tensors)
    for name in distinct:
        if ".experts." in name:
            distinct[name] = (0.2 * rng.standard_normal(distinct[name].shape)).astype(np.float32)
    moe = build_model(moe_config, distinct)
    x = rng.standard_normal((6, 16))
    block = moe._moe(0, x)
    gate = moe.w["model.layers.0.block_sparse_moe.gate.weight"]
    for t in range(6):
        logit = gate @ x[t]
        prob = np.exp(logit - logit.max())
        prob /= prob.sum()
        top = sorted(range(4), key=lambda e: -prob[e])[:2]
        norm = sum(prob[e] for e in top)
        want = sum(prob[e] / norm * moe._expert(0, e, x[t:t + 1])[0] for e in top)
        assert np.allclose(block[t], want, rtol=0, atol=1e-12), "MoE routing"
    moe_logits = moe.logits(tokens)
    assert np.allclose(moe.logits(tokens[:4]), moe_logits[:4], rtol=0, atol=1e-6)

    # Mixtral sliding window of 3 (one layer): position 4 sees keys 2..4 only, position 3
    # still sees key 1.
    one_layer = {k: v for k, v in distinct.items() if not k.startswith("model.layers.1.")}
    windowed = build_model(dict(moe_config, num_hidden_layers=1, sliding_window=3), one_layer)
    a = windowed.hidden_states([1, 2, 3, 4, 5])
    b = windowed.hidden_states([9, 9, 3, 4, 5])
    assert np.max(np.abs(a[4] - b[4])) < 1e-12, "sliding window leaks old keys"
    assert np.max(np.abs(a[3] - b[3])) > 1e-6, "sliding window hides keys in range"

    # Config and tensor validation.
    _expect_error(lambda: build_model(_llama_config(attention_bias=True), tensors),
                  "attention_bias")
    _expect_error(lambda: build_model(_llama_config(mlp_bias=True), tensors), "mlp_bias")
    _expect_error(lambda: build_model(_llama_config(hidden_act="gelu"), tensors), "hidden_act")
    _expect_error(lambda: build_model(_llama_config(rope_scaling={"type": "linear",
                                                                  "factor": 2.0}), tensors),
                  "rope_scaling")
    _expect_error(lambda: build_model(_llama_config(model_type="gpt2"), tensors), "model_type")
    missing = dict(tensors)
    del missing["model.layers.1.mlp.up_proj.weight"]
    _expect_error(lambda: build_model(config, missing), "'model.layers.1.mlp.up_proj.weight'",
                  "missing")
    extra = dict(tensors, **{"model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(2)})
    _expect_error(lambda: build_model(config, extra),
                  "'model.layers.0.self_attn.rotary_emb.inv_freq'", "unexpected")
    bad = dict(tensors, **{"model.norm.weight": np.ones(15, dtype=np.float32)})
    _expect_error(lambda: build_model(config, bad), "'model.norm.weight'", "shape")
    _expect_error(lambda: model.logits([37]), "token id")


def selftest() -> None:
    """Runs the self-contained checks; raises AssertionError on failure.

    Checks: the safetensors reader (F32/BF16/F16 round trips, known BF16 bit patterns, and a
    ValueError naming the tensor for an out-of-range, overlapping, mis-sized, unknown-dtype,
    reversed, negative-shape, duplicate, hole-leaving or under-covering entry, plus a header
    length beyond the file); the RoPE pairing convention and the relative-position property of
    the attention scores; causality of the full model; GQA against an equivalent MHA model;
    tied embeddings; Mixtral with identical experts against the Llama MLP, and the MoE block
    against a per-token brute force; the Mixtral sliding-window mask; config and tensor-name
    validation.
    """
    start = time.time()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        _selftest_safetensors(tmp, rng)
        _selftest_rope()
        _selftest_models(tmp, rng)
    print(f"selftest passed in {time.time() - start:.2f}s")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parse_tokens(text: str) -> List[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad token list {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("empty token list")
    return ids


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", help="model folder (config.json, model.safetensors)")
    parser.add_argument("--tokens", action="append", type=_parse_tokens, default=[],
                        help="comma-separated token ids; repeat for several sequences")
    parser.add_argument("--selftest", action="store_true", help="run the built-in checks")
    args = parser.parse_args(argv)
    if args.selftest:
        selftest()
        return 0
    if args.folder is None or not args.tokens:
        parser.error("FOLDER and at least one --tokens are required (or --selftest)")
    model = load_model(args.folder)
    result = {"logits": [model.logits(ids).astype(float).tolist() for ids in args.tokens]}
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
