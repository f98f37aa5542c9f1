# Rotary-embedding inverse frequencies for the PyTorch oracles (ops_oracle.py, llama_oracle.py): llama2.c's
# precompute_freqs_cis and transformers' modeling_rope_utils.py (default, linear and llama3 rope_scaling), written
# out from their sources in float32 tensor ops.
import math

import torch


def inv_freq(dim, theta, scaling=None):
    """(dim / 2) float32: theta^(-2k/dim), changed as scaling ({"rope_type": "linear"|"llama3", "factor", ...})."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv
    factor = scaling["factor"]
    if kind == "linear":  # _compute_linear_scaling_rope_parameters
        return inv / factor
    assert kind == "llama3", kind
    # _compute_llama3_parameters
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv
    inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_llama)
