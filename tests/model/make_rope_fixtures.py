#!/usr/bin/env python3
"""Writes tests/model/rope_hf_fixtures.h: RoPE numbers computed by transformers' own rotary
embedding (the family's <Family>RotaryEmbedding built from AutoConfig.from_pretrained of each
config.json below) for rope_scaling_test.cpp, which reads the same config.json with
model_options_from_hf_config and holds ulysses-train's RotaryEmbedding to these numbers.

  .venv/bin/python tests/model/make_rope_fixtures.py > tests/model/rope_hf_fixtures.h

Each case: the config.json text, inv_freq (fp32), attention_scaling, and cos/sin (fp32, first half
of the head dim: HF duplicates it) at a few positions. Floats are written as hex literals, so the
header holds transformers' fp32 values exactly.
"""
import json
import os
import sys
import tempfile
import warnings

import torch
import transformers

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

ROTARY = {
    "llama": transformers.models.llama.modeling_llama.LlamaRotaryEmbedding,
    "qwen2": transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding,
    "qwen3": transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding,
    "mistral": transformers.models.mistral.modeling_mistral.MistralRotaryEmbedding,
}


def shape(family, hidden, heads, head_dim=None, max_pos=4096, theta=None):
    """A config.json of `family`; max_pos None leaves max_position_embeddings out (the config
    class's default applies)."""
    config = {"model_type": family, "hidden_size": hidden, "num_hidden_layers": 1,
              "num_attention_heads": heads, "num_key_value_heads": heads,
              "intermediate_size": 2 * hidden, "vocab_size": 256}
    if max_pos is not None:
        config["max_position_embeddings"] = max_pos
    if head_dim is not None:
        config["head_dim"] = head_dim
    if theta is not None:
        config["rope_theta"] = theta
    return config


# (name, config.json, positions). Positions reach past each case's original context.
CASES = [
    ("default_qwen2", shape("qwen2", 64, 4, theta=1.0e6), [0, 1, 63, 4095]),
    ("linear_legacy_type_key",
     dict(shape("llama", 128, 4), rope_scaling={"type": "linear", "factor": 4.0}),
     [0, 3, 1000, 16383]),
    ("linear_rope_parameters",
     dict(shape("qwen3", 128, 2, head_dim=64),
          rope_parameters={"rope_type": "linear", "factor": 2.5, "rope_theta": 500000.0}),
     [0, 1, 2047, 10239]),
    # Below max_position_embeddings transformers' dynamic NTK is its init-time frequencies.
    ("dynamic_below_max_position",
     dict(shape("mistral", 128, 4, theta=1.0e6, max_pos=4096),
          rope_scaling={"rope_type": "dynamic", "factor": 3.0}),
     [0, 5, 1234, 4095]),
    # Qwen2.5's long-context setting as its model cards give it (legacy key, "type").
    ("yarn_qwen25_legacy",
     dict(shape("qwen2", 1024, 8, theta=1.0e6, max_pos=131072),
          rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
     [0, 1, 32767, 131071]),
    ("yarn_mscale_betas_no_truncate",
     dict(shape("qwen2", 256, 4, max_pos=16384),
          rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0,
                           "original_max_position_embeddings": 2048, "beta_fast": 16,
                           "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0,
                           "truncate": False}),
     [0, 7, 2048, 16383]),
    # attention_factor given; a top-level original_max_position_embeddings wins over the object's.
    ("yarn_attention_factor_top_level_original",
     dict(shape("llama", 128, 4, theta=10000.0, max_pos=16384),
          original_max_position_embeddings=1024,
          rope_scaling={"rope_type": "yarn", "factor": 16.0, "attention_factor": 0.9,
                        "original_max_position_embeddings": 512}),
     [0, 1, 1023, 16383]),
    # factor null: max_position_embeddings / original; truncate null: no truncation (falsy).
    ("yarn_factor_null_truncate_null",
     dict(shape("qwen3", 128, 4, head_dim=32, theta=10000.0, max_pos=8192),
          rope_scaling={"rope_type": "yarn", "factor": None,
                        "original_max_position_embeddings": 1024, "truncate": None}),
     [0, 2, 1024, 8191]),
    # Both objects: transformers takes the legacy rope_scaling (rope_scaling or rope_parameters).
    ("yarn_rope_scaling_wins_over_rope_parameters",
     dict(shape("qwen2", 64, 2, max_pos=256),
          rope_scaling={"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
                        "rope_theta": 20000.0},
          rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 30000.0}),
     [0, 1, 127, 255]),
    # Neither max_position_embeddings nor original_max_position_embeddings: Qwen2Config's default
    # 32768 is the original context.
    ("yarn_qwen2_class_default_max_position",
     dict(shape("qwen2", 128, 4, max_pos=None),
          rope_scaling={"type": "yarn", "factor": 2.0}),
     [0, 1, 32767, 65535]),
    ("llama3_llama31",
     dict(shape("llama", 1024, 8, theta=500000.0, max_pos=131072),
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
     [0, 1, 8191, 131071]),
]


def hexf(value):
    """An fp32 value as an exact C++ float literal (hex, mantissa zeros dropped)."""
    mantissa, exponent = float(value).hex().split("p")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}p{exponent}f"


def floats(values):
    return "{" + ", ".join(hexf(v) for v in values) + "}"


def main():
    out = []
    out.append("// Generated by tests/model/make_rope_fixtures.py from transformers "
               f"{transformers.__version__} (torch {torch.__version__}); do not edit by hand.")
    out.append("// Regenerate: .venv/bin/python tests/model/make_rope_fixtures.py > "
               "tests/model/rope_hf_fixtures.h")
    out.append("#pragma once")
    out.append("#include <cstdint>")
    out.append("#include <vector>")
    out.append("")
    out.append("namespace ulysses::model::fixtures {")
    out.append("")
    out.append("struct RopeFixture {")
    out.append("  const char* name;")
    out.append("  const char* config_json;          // the config.json transformers read")
    out.append("  double attention_scaling;         // HF rotary_emb.attention_scaling")
    out.append("  std::vector<float> inv_freq;      // [hd/2]")
    out.append("  std::vector<int64_t> positions;   // [P]")
    out.append("  std::vector<float> cos;           // [P, hd/2] (HF's first half)")
    out.append("  std::vector<float> sin;           // [P, hd/2]")
    out.append("};")
    out.append("")
    out.append("inline const std::vector<RopeFixture>& rope_fixtures() {")
    out.append("  static const std::vector<RopeFixture> cases = {")
    for name, config, positions in CASES:
        work = tempfile.mkdtemp()
        text = json.dumps(config, sort_keys=True)
        with open(os.path.join(work, "config.json"), "w") as f:
            f.write(text)
        hf = transformers.AutoConfig.from_pretrained(work)
        rotary = ROTARY[config["model_type"]](hf)
        x = torch.zeros(1, dtype=torch.float32)
        pos = torch.tensor([positions], dtype=torch.int64)
        cos, sin = rotary(x, pos)  # [1, P, hd] fp32
        half = cos.shape[-1] // 2
        assert torch.equal(cos[..., :half], cos[..., half:])
        out.append(f"      {{\"{name}\",")
        out.append(f"       R\"json({text})json\",")
        out.append(f"       {rotary.attention_scaling!r},")
        out.append(f"       {floats(rotary.inv_freq.tolist())},")
        out.append("       {" + ", ".join(str(p) for p in positions) + "},")
        out.append(f"       {floats(cos[0, :, :half].reshape(-1).tolist())},")
        out.append(f"       {floats(sin[0, :, :half].reshape(-1).tolist())}}},")
    out.append("  };")
    out.append("  return cases;")
    out.append("}")
    out.append("")
    out.append("}  // namespace ulysses::model::fixtures")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
