"""Synthetic checkpoints, tokenizers, catalogs and prompts (flashrec.synth)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from flashrec.synth import (
    PRESETS,
    TokenLayout,
    add_synth_args,
    build_checkpoint,
    config_dict,
    format_sid,
    num_parameters,
    read_catalog_json,
    run_synth,
    synth_catalog,
    synth_prompts,
    write_catalog_json,
)
from flashrec.synth.checkpoint import content_hash

transformers = pytest.importorskip("transformers")

K, L = 64, 3  # tiny presets
LAYOUT = TokenLayout(K, L)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _linear_names(state: dict) -> list[str]:
    return [n for n in state if n.endswith(".weight") and any(f".{x}." in n for x in LINEARS)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=0, catalog_size=500)


@pytest.fixture(scope="module")
def hf_tiny(tiny):
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny).eval()
    return tok, model


def _sid_logits(tok, model, messages: list[dict]) -> torch.Tensor:
    """Logits over level-a codes right after ``<|sid_begin|>``."""
    text = (
        tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        + "<|sid_begin|>"
    )
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
    return logits[LAYOUT.first_code_id : LAYOUT.first_code_id + K]


# --- tiny checkpoint in HF -------------------------------------------------------------------


def test_tiny_files_and_config(tiny):
    names = {p.name for p in tiny.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "catalog.json",
        "synth_info.json",
    } <= names
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["vocab_size"] == LAYOUT.size == 256 + 5 + K * L + 2
    assert cfg["eos_token_id"] == LAYOUT.eos_id and cfg["tie_word_embeddings"] is True
    assert cfg["head_dim"] == 16 and cfg["attention_bias"] is False and cfg["use_cache"] is True
    state = load_file(tiny / "model.safetensors")
    assert "lm_head.weight" not in state
    assert state["model.layers.0.self_attn.q_norm.weight"].shape == (16,)
    assert state["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    assert all(t.dtype == torch.float32 for t in state.values())
    norm = state["model.layers.0.input_layernorm.weight"]
    assert 0.8 <= norm.min() and norm.max() <= 1.2 and norm.std() > 0.05


def test_tiny_loads_and_generates(hf_tiny):
    tok, model = hf_tiny
    ids = tok("User history: watched item 12", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)


def test_tiny_loads_without_missing_keys(tiny):
    _, info = transformers.AutoModelForCausalLM.from_pretrained(tiny, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_sid_tokens_contiguous_in_strict_order(hf_tiny):
    tok, _ = hf_tiny
    codes = [f"<s_{'abc'[lv]}_{c}>" for lv in range(L) for c in range(K)]
    ids = tok.convert_tokens_to_ids(codes + ["<|sid_begin|>", "<|sid_end|>"])
    first = LAYOUT.first_code_id
    assert ids == list(range(first, first + L * K + 2))
    assert LAYOUT.sid_begin_id == first + L * K and LAYOUT.sid_end_id == LAYOUT.sid_begin_id + 1
    assert LAYOUT.code_id(2, 301 % K) == first + 2 * K + 301 % K
    added = tok.get_added_vocab()
    assert all(c in added for c in codes) and "<|im_end|>" in added
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == LAYOUT.eos_id
    assert tok.pad_token == "<|endoftext|>"


def test_sid_decode_and_encode(hf_tiny):
    tok, _ = hf_tiny
    sid = format_sid([12, 7, 30])
    ids = tok(sid, add_special_tokens=False).input_ids
    assert ids == [
        LAYOUT.sid_begin_id,
        LAYOUT.code_id(0, 12),
        LAYOUT.code_id(1, 7),
        LAYOUT.code_id(2, 30),
        LAYOUT.sid_end_id,
    ]
    assert tok.decode(ids, skip_special_tokens=False) == sid
    assert tok.decode(ids[1:4], skip_special_tokens=True) == "<s_a_12><s_b_7><s_c_30>"


def test_byte_level_lossless(hf_tiny):
    tok, _ = hf_tiny
    text = "héllo wörld 🎧 — \t\n  tabs, 中文, \x00\x7f"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text.encode()) and max(ids) < 256
    assert tok.decode(ids) == text


def test_chat_template(hf_tiny):
    tok, _ = hf_tiny
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    no_think = tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nab<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    plain = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert plain.endswith("<|im_start|>assistant\n")
    bare = tok.apply_chat_template(msgs[:1], tokenize=False)
    assert bare == "<|im_start|>system\nS<|im_end|>\n"


def test_logits_spread_over_sid_codes(hf_tiny):
    tok, model = hf_tiny
    rows = [_sid_logits(tok, model, m) for m in synth_prompts(4, median_tokens=80, seed=1)]
    for row in rows:
        assert row.std() >= 1.0  # several nats between codes: no beam ranking by 1e-6 near-ties
        top2 = row.topk(2).values
        assert top2[0] - top2[1] > 1e-3
    spread = torch.stack(rows)
    assert (spread.max(0).values - spread.min(0).values).max() > 1.0  # depends on the prompt


# --- determinism, overrides, dtypes ----------------------------------------------------------


def test_deterministic_by_seed(tmp_path, tiny):
    again = build_checkpoint(tmp_path / "a", "tiny", seed=0, catalog_size=500)
    other = build_checkpoint(tmp_path / "b", "tiny", seed=1, catalog_size=500)
    same = (again / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    assert same
    info = [json.loads((d / "synth_info.json").read_text()) for d in (tiny, again, other)]
    assert info[0]["content_hash"] == info[1]["content_hash"] != info[2]["content_hash"]
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()
    assert info[0]["content_hash"] == content_hash(tiny, info[0]["files"])
    assert info[0]["preset"] == "tiny" and info[0]["seed"] == 0 and info[0]["dtype"] == "float32"


def test_overrides(tmp_path):
    out = build_checkpoint(
        tmp_path,
        "tiny",
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=False,
        num_hidden_layers=3,
    )
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_hidden_layers"]) == (1, 32, 3)
    assert cfg["tie_word_embeddings"] is False
    state = load_file(out / "model.safetensors")
    assert state["lm_head.weight"].shape == (LAYOUT.size, 64)
    assert state["model.layers.2.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    assert state["model.layers.2.self_attn.k_proj.weight"].shape == (32, 64)
    assert state["model.layers.2.self_attn.o_proj.weight"].shape == (64, 4 * 32)
    info = json.loads((out / "synth_info.json").read_text())
    assert info["overrides"]["head_dim"] == 32
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_key_value_heads == 1


def test_override_validation(tmp_path):
    with pytest.raises(TypeError, match="unknown SynthPreset field"):
        build_checkpoint(tmp_path, "tiny", hidden=3)
    with pytest.raises(ValueError, match="multiple"):
        build_checkpoint(tmp_path, "tiny", num_key_value_heads=3)
    with pytest.raises(ValueError, match="unknown synth preset"):
        build_checkpoint(tmp_path, "huge")
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        build_checkpoint(tmp_path, "tiny", vocab_size=300)


def test_default_dtype_from_preset(tmp_path):
    out = build_checkpoint(tmp_path, "tiny", hidden_size=32, default_dtype="bf16")
    assert json.loads((out / "synth_info.json").read_text())["dtype"] == "bf16"
    assert load_file(out / "model.safetensors")["model.norm.weight"].dtype == torch.bfloat16
    assert PRESETS["tiny"].default_dtype == "float32"


def test_padded_vocab(tmp_path):
    out = build_checkpoint(tmp_path, "tiny", vocab_size=512)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 512
    assert load_file(out / "model.safetensors")["model.embed_tokens.weight"].shape == (512, 64)


def test_layer_weights_independent_of_depth(tmp_path, tiny):
    deeper = load_file(
        build_checkpoint(tmp_path, "tiny", num_hidden_layers=3) / "model.safetensors"
    )
    base = load_file(tiny / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(deeper[name], base[name])


def test_fp8_matches_bf16(tmp_path):
    bf16 = load_file(
        build_checkpoint(tmp_path / "bf16", "tiny", dtype="bf16") / "model.safetensors"
    )
    out = build_checkpoint(tmp_path / "fp8", "tiny", dtype="fp8")
    fp8 = load_file(out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_scheme": "per_channel",
    }
    assert cfg["torch_dtype"] == "bfloat16"
    linears = _linear_names(bf16)
    assert len(linears) == 2 * 7
    for name in linears:
        w, scale = fp8[name], fp8[name + "_scale"]
        assert w.dtype == torch.float8_e4m3fn and w.shape == bf16[name].shape
        assert scale.dtype == torch.float32 and scale.shape == (w.shape[0], 1)
        ref = bf16[name].float()
        torch.testing.assert_close(scale, ref.abs().amax(1, keepdim=True) / 448, rtol=1e-2, atol=0)
        deq = w.float() * scale
        assert ((deq - ref).abs() <= 0.07 * ref.abs() + scale * 2**-8).all()
    others = [n for n in fp8 if n not in linears and not n.endswith("_scale")]
    assert others and all(fp8[n].dtype == torch.bfloat16 for n in others)
    assert torch.equal(fp8["model.embed_tokens.weight"], bf16["model.embed_tokens.weight"])


@pytest.mark.parametrize(
    ("preset", "arch", "has_bias", "has_qk_norm", "has_lm_head"),
    [
        ("tiny-llama", "LlamaForCausalLM", False, False, True),
        ("tiny-qwen2", "Qwen2ForCausalLM", True, False, False),
    ],
)
def test_other_architectures_load(tmp_path, preset, arch, has_bias, has_qk_norm, has_lm_head):
    out = build_checkpoint(tmp_path, preset)
    state = load_file(out / "model.safetensors")
    assert ("model.layers.0.self_attn.q_proj.bias" in state) == has_bias
    assert ("model.layers.0.self_attn.k_norm.weight" in state) == has_qk_norm
    assert ("lm_head.weight" in state) == has_lm_head
    assert "model.layers.0.self_attn.o_proj.bias" not in state
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == arch
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok(format_sid([1, 2, 3]), return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2
    logits = _sid_logits(tok, model.eval(), [{"role": "user", "content": "User history: x"}])
    assert logits.std() >= 1.0


# --- onerec-1.7b -----------------------------------------------------------------------------


def test_onerec_config_without_weights():
    p = PRESETS["onerec-1.7b"]
    cfg = config_dict(p, "bf16")
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == 176_384
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == (
        2048,
        28,
        6144,
    )
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (16, 8, 128)
    assert cfg["max_position_embeddings"] == 40_960 and cfg["rope_theta"] == 1e6
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
    assert (p.codebook_size, p.num_levels, p.default_dtype) == (8192, 3, "bf16")
    assert TokenLayout(8192, 3).size < 176_384
    assert 1.6e9 < num_parameters(p) < 1.8e9  # ~3.4 GB in bf16


@pytest.mark.slow
def test_onerec_builds_and_loads(tmp_path):
    out = build_checkpoint(tmp_path, "onerec-1.7b", dtype="bf16", progress=False)
    size = (out / "model.safetensors").stat().st_size
    assert 3.2e9 < size < 3.6e9
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [176_384, 2048]
        assert f.get_slice("model.layers.27.mlp.down_proj.weight").get_shape() == [2048, 6144]
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert model.config.vocab_size == 176_384
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<|sid_end|>") == TokenLayout(8192, 3).sid_end_id
    ids = tok("User history: watched item 1<|sid_begin|>", return_tensors="pt").input_ids
    with torch.no_grad():
        out_ids = model.generate(ids, max_new_tokens=2, do_sample=False)
        logits = model(ids).logits[0, -1].float()
    assert out_ids.shape[1] == ids.shape[1] + 2
    first = TokenLayout(8192, 3).first_code_id
    assert logits[first : first + 8192].std() >= 1.0


# --- catalogs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "k", "levels"), [(500, 64, 3), (60_000, 64, 3), (8, 2, 3), (1000, 8192, 3), (0, 4, 2)]
)
def test_catalog_unique_sorted_in_range(n, k, levels):
    codes = synth_catalog(n, k, levels, seed=3)
    assert codes.shape == (n, levels) and codes.dtype == np.int64
    assert len(np.unique(codes, axis=0)) == n
    assert (np.lexsort(codes.T[::-1]) == np.arange(n)).all()
    if n:
        assert codes.min() >= 0 and codes.max() < k
    assert np.array_equal(codes, synth_catalog(n, k, levels, seed=3))


def test_catalog_seed_and_limits():
    assert not np.array_equal(synth_catalog(100, 64, 3, seed=0), synth_catalog(100, 64, 3, seed=1))
    with pytest.raises(ValueError):
        synth_catalog(9, 2, 3)


def test_catalog_json_roundtrip(tmp_path, tiny):
    codes = synth_catalog(300, 64, 3, seed=5)
    path = write_catalog_json(codes, tmp_path / "c.json")
    table = json.loads(path.read_text())
    key = ",".join(map(str, codes[7]))
    assert table[key] == {"pid": 7} and len(table) == 300
    assert np.array_equal(read_catalog_json(path), codes)
    assert np.array_equal(read_catalog_json(tiny / "catalog.json"), synth_catalog(500, K, L, 0))
    write_catalog_json(codes.tolist(), tmp_path / "l.json")
    assert (tmp_path / "l.json").read_text() == path.read_text()


# --- prompts ----------------------------------------------------------------------------------


def test_prompts_deterministic_and_prefix_stable():
    a = synth_prompts(20, median_tokens=200, seed=4, system_prompt_tokens=50)
    assert a == synth_prompts(20, median_tokens=200, seed=4, system_prompt_tokens=50)
    assert a[:5] == synth_prompts(5, median_tokens=200, seed=4, system_prompt_tokens=50)
    assert a != synth_prompts(20, median_tokens=200, seed=5, system_prompt_tokens=50)


def test_prompts_lengths_and_system_prompt():
    prompts = synth_prompts(200, median_tokens=400, spread=0.3, seed=2, system_prompt_tokens=64)
    systems = {p[0]["content"] for p in prompts}
    assert len(systems) == 1 and len(systems.pop().encode()) == 64
    assert all([m["role"] for m in p] == ["system", "user"] for p in prompts)
    lengths = np.array([len(p[1]["content"].encode()) for p in prompts])
    assert abs(np.median(lengths) - 400) < 0.15 * 400
    assert lengths.std() > 50  # log-normal, not constant
    assert prompts[0][1]["content"].startswith("User history: ")
    short = synth_prompts(50, median_tokens=4, seed=2)
    assert all(len(p) == 1 and len(p[0]["content"]) == 16 for p in short)


def test_prompts_measured_in_tokenizer_tokens(hf_tiny):
    tok, _ = hf_tiny
    prompts = synth_prompts(10, median_tokens=100, seed=7, system_prompt_tokens=20, tokenizer=tok)
    plain = synth_prompts(10, median_tokens=100, seed=7, system_prompt_tokens=20)
    assert prompts == plain  # the synthetic tokenizer is byte-level: tokens == bytes
    n = len(tok(prompts[0][1]["content"], add_special_tokens=False).input_ids)
    assert n == len(prompts[0][1]["content"].encode())


# --- CLI --------------------------------------------------------------------------------------


def test_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_synth_args(parser)
    args = parser.parse_args(
        [
            "--preset",
            "tiny-llama",
            "--out",
            str(tmp_path / "m"),
            "--seed",
            "3",
            "--catalog-size",
            "10",
            "--set",
            "num_key_value_heads=4",
        ]
    )
    assert run_synth(args) == 0
    printed = capsys.readouterr().out.strip()
    assert Path(printed) == tmp_path / "m"
    info = json.loads((tmp_path / "m" / "synth_info.json").read_text())
    assert (info["preset"], info["seed"], info["dtype"]) == ("tiny-llama", 3, "float32")
    assert info["overrides"] == {"num_key_value_heads": 4} and info["catalog_size"] == 10
    bad = parser.parse_args(["--out", str(tmp_path / "x"), "--set", "nope=1"])
    assert run_synth(bad) == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x", "--preset", "huge"])
