"""Loader: merge table, FP8 checkpoints / on-load quantization, loud failures naming tensors."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.models.loader import CheckpointError

# Documented tolerance (docs/configuration.md): mean |sequence_score| difference of FP8 (W8A8
# per channel) vs the unquantized model on the tiny preset, and top-1 agreement.
FP8_SCORE_TOL = 0.25


def _engine(path, **kw):
    return Engine(
        EngineConfig(model_path=str(path), sid_vocab_file=str(path / "catalog.json"), **kw)
    )


def test_fused_projections_equal_separate(tiny_model):
    eng = _engine(tiny_model)
    raw = load_file(str(tiny_model / "model.safetensors"))
    attn = eng.runner.model.layers[1].self_attn
    want = torch.cat([raw[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"], 0)
    assert torch.equal(attn.qkv_proj.weight, want)
    x = torch.randn(5, want.shape[1])
    q = x @ raw["model.layers.1.self_attn.q_proj.weight"].t()
    assert torch.allclose(attn.qkv_proj(x)[:, : q.shape[1]], q, atol=1e-6)
    mlp = eng.runner.model.layers[0].mlp
    up = x @ raw["model.layers.0.mlp.up_proj.weight"].t()
    assert torch.allclose(mlp.gate_up_proj(x)[:, mlp.inter :], up, atol=1e-6)


def _scores(eng):
    ids = eng.build_prompt(messages=[{"role": "user", "content": "fp8 tolerance check"}])
    return eng.generate([eng.new_request(ids, n=16)])[0].beams


@pytest.mark.parametrize("mode", ["checkpoint", "on-load"])
def test_fp8_within_tolerance(synth_model, tiny_model, mode):
    ref = _scores(_engine(tiny_model))
    if mode == "checkpoint":
        path = synth_model("tiny", catalog_size=2000, dtype="fp8")
        eng = _engine(
            path
        )  # quantization_config turns FP8 on; CPU computes from dequantized weights
    else:
        eng = _engine(tiny_model, quantization="fp8")
    assert eng.runner.use_fp8
    assert eng.runner.model.layers[0].self_attn.qkv_proj.is_fp8
    got = _scores(eng)
    assert got[0].token_ids == ref[0].token_ids
    diff = sum(abs(a.sequence_score - b.sequence_score) for a, b in zip(got, ref)) / len(ref)
    assert diff <= FP8_SCORE_TOL


def test_directory_name_does_not_turn_on_fp8(tiny_model, tmp_path):
    d = tmp_path / "model-fp8"
    shutil.copytree(tiny_model, d)
    assert not _engine(d).runner.use_fp8


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fp8_only_when_asked_on_any_device(synth_model, tiny_model, device):
    """The design notes' rule: without quantization_config, FP8 GEMMs need an explicit
    --quantization fp8, on a GPU too (a BF16 checkpoint is not quantized at load by default);
    an FP8 checkpoint is FP8 unless another --quantization dequantizes it."""
    from types import SimpleNamespace

    from flashrec.config import EngineConfig, ModelConfig
    from flashrec.engine.runner import ModelRunner

    fp8_dir = synth_model("tiny", catalog_size=2000, dtype="fp8")

    def resolve(path, **kw) -> bool:
        cfg = EngineConfig(model_path=str(path), device=device, **kw)
        return ModelRunner._resolve_fp8(SimpleNamespace(config=cfg), ModelConfig.from_path(path))

    assert not resolve(tiny_model)
    assert resolve(tiny_model, quantization="fp8")
    assert resolve(fp8_dir) and not resolve(fp8_dir, quantization="none")


def _broken(tiny_model, tmp_path, edit):
    d = tmp_path / "broken"
    shutil.copytree(tiny_model, d)
    tensors = load_file(str(d / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize(
    "case,edit,needle",
    [
        (
            "missing",
            lambda t: t.pop("model.layers.1.post_attention_layernorm.weight"),
            "layers.1.post_attention_layernorm.weight",
        ),
        (
            "unexpected",
            lambda t: t.__setitem__("model.layers.0.mlp.extra.weight", torch.zeros(2, 2)),
            "model.layers.0.mlp.extra.weight",
        ),
        (
            "misshaped",
            lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.weight", torch.zeros(3, 3)),
            "model.layers.0.self_attn.o_proj.weight",
        ),
        ("incomplete-fused", lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"), "qkv_proj"),
        (
            "fp8-without-scale",
            lambda t: t.__setitem__(
                "model.layers.0.mlp.down_proj.weight",
                t["model.layers.0.mlp.down_proj.weight"].to(torch.float8_e4m3fn),
            ),
            "model.layers.0.mlp.down_proj.weight",
        ),
    ],
)
def test_bad_checkpoint_names_tensor(tiny_model, tmp_path, case, edit, needle):
    d = _broken(tiny_model, tmp_path, edit)
    with pytest.raises(CheckpointError, match=needle.replace(".", r"\.")):
        _engine(d)


def test_unknown_architecture_lists_supported(tiny_model, tmp_path):
    import json

    d = tmp_path / "arch"
    shutil.copytree(tiny_model, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MysteryForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="Qwen3ForCausalLM"):
        _engine(d)


@pytest.mark.parametrize(
    "edit,refused",
    [
        ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1}, True),
        ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 64}, True),
        ({"use_sliding_window": False, "sliding_window": 64}, False),  # Qwen2.5's configs
        ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 99}, False),
        # a window as wide as every position never cuts anything
        ({"use_sliding_window": True, "sliding_window": 1 << 20, "max_window_layers": 0}, False),
    ],
)
def test_sliding_window_configs_are_refused(tiny_model, tmp_path, edit, refused):
    """Every attention path attends to the whole prompt: a config with windowed layers is
    refused at load (naming the layers), never served as full attention."""
    import json

    from flashrec.config import ModelConfig

    cfg = json.loads((tiny_model / "config.json").read_text())
    cfg.pop("layer_types", None)
    cfg["num_hidden_layers"] = 2
    cfg["max_position_embeddings"] = 4096
    cfg.update(edit)
    if refused:
        with pytest.raises(ValueError, match=r"sliding-window attention .*layers 1\.\.1"):
            ModelConfig.from_dict(cfg)
    else:
        assert ModelConfig.from_dict(cfg).num_hidden_layers == 2


def test_qwen2_biases_and_llama_without_qk_norm(synth_model):
    q2 = synth_model("tiny-qwen2", catalog_size=200)
    eng = _engine(q2)
    raw = load_file(str(q2 / "model.safetensors"))
    attn = eng.runner.model.layers[0].self_attn
    want = torch.cat([raw[f"model.layers.0.self_attn.{p}_proj.bias"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.bias, want)
    assert attn.o_proj.bias is None and attn.q_norm is None
    ll = _engine(synth_model("tiny-llama", catalog_size=200))
    a = ll.runner.model.layers[1].self_attn
    assert a.q_norm is None and a.k_norm is None and a.qkv_proj.bias is None
    assert ll.runner.model.lm_head_weight is not None  # untied


def test_other_1_5b_presets_have_their_shapes():
    from flashrec.synth import PRESETS
    from flashrec.synth.checkpoint import config_dict, num_parameters

    for name, arch in (("qwen2-1.5b", "Qwen2ForCausalLM"), ("llama-1.5b", "LlamaForCausalLM")):
        cfg = config_dict(PRESETS[name])
        assert cfg["architectures"] == [arch]
        assert 1.4e9 < num_parameters(PRESETS[name]) < 1.7e9


def test_prompt_builder_owns_a_tokenizer_and_matches_build_prompt(tiny_model):
    """Each extra prompt-building thread of the server gets ``prompt_builder()``: its own
    tokenizer object (never the engine's), the same ids for chat messages, text and ids."""
    eng = _engine(tiny_model)
    build = eng.prompt_builder()
    other = eng.prompt_builder()
    assert build.args[0] is not eng.tokenizer and build.args[0] is not other.args[0]
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "<s_a_1> hi " * 40}]
    for kw in ({"messages": msgs}, {"text": "plain words"}, {"input_ids": [3, 4, 5]}):
        assert build(**kw) == eng.build_prompt(**kw) == other(**kw)


def test_prompt_builder_loads_a_tokenizer_it_cannot_copy(tiny_model, monkeypatch):
    import types

    import flashrec.engine.engine as engine_mod

    eng = _engine(tiny_model)

    def refuse(obj, memo=None):
        raise TypeError("cannot pickle the tokenizer")

    monkeypatch.setattr(engine_mod, "copy", types.SimpleNamespace(deepcopy=refuse))
    build = eng.prompt_builder()
    assert build.args[0] is not eng.tokenizer
    assert build(text="plain words") == eng.build_prompt(text="plain words")


def _block_fp8(w: torch.Tensor, b0: int, b1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise e4m3 quantization as in Qwen3-*-FP8 checkpoints: one float32 scale per
    ``b0 x b1`` block (``weight_scale_inv``, multiplied to dequantize), partial edge blocks."""
    rows, cols = w.shape
    g0, g1 = -(-rows // b0), -(-cols // b1)
    scale = torch.empty(g0, g1)
    codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(g0):
        for j in range(g1):
            blk = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1].float()
            s = blk.abs().amax().clamp(min=1e-12) / 448.0
            scale[i, j] = s
            codes[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = (blk / s).to(torch.float8_e4m3fn)
    return codes, scale


@pytest.fixture(scope="module")
def block_fp8_model(tiny_model, tmp_path_factory):
    """The tiny checkpoint with every decoder projection in block-wise FP8 (blocks of 48 x 48:
    partial edge blocks on the 64- and 128-wide dims) plus static input_scale tensors, and a
    Qwen3-FP8-style quantization_config."""
    import json

    d = tmp_path_factory.mktemp("blockfp8")
    for f in tiny_model.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, d / f.name)
    tensors = load_file(str(tiny_model / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            codes, scale = _block_fp8(t, 48, 48)
            out[name] = codes
            out[name[: -len("weight")] + "weight_scale_inv"] = scale
            out[name[: -len("weight")] + "input_scale"] = torch.tensor(0.01)
        else:
            out[name] = t
    save_file(out, str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [48, 48],
    }  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    return d, out


@pytest.mark.parametrize("quantization", [None, "none"])
def test_block_wise_fp8_checkpoint_loads(tiny_model, block_fp8_model, quantization):
    """A checkpoint with block-wise weight scales loads: FP8 (the default for an FP8
    checkpoint) requantizes each weight per output channel from its block-dequantized values;
    --quantization none keeps the block-dequantized values exactly. Both stay within the FP8
    tolerance of the unquantized model."""
    path, raw = block_fp8_model
    kw = {} if quantization is None else {"quantization": quantization}
    eng = _engine(path, **kw)
    lin = eng.runner.model.layers[0].self_attn.o_proj
    name = "model.layers.0.self_attn.o_proj.weight"
    codes, scale = raw[name], raw["model.layers.0.self_attn.o_proj.weight_scale_inv"]
    exact = codes.float() * scale.repeat_interleave(48, 0)[:64].repeat_interleave(48, 1)[:, :64]
    assert lin.is_fp8 is (quantization is None)
    if quantization is None:
        assert lin.weight_scale.shape == (64, 1)  # one scale per output channel
        # requantized per channel: within half an e4m3 step (2^-4 relative) of the blocks
        err = (lin.dequantized_weight() - exact).abs()
        assert (err <= exact.abs().amax(dim=1, keepdim=True) / 448.0 * 32 + 1e-6).all()
        assert err.max() > 0  # really requantized, not the block codes reused as they are
    else:
        assert torch.equal(lin.weight.float(), exact.to(lin.weight.dtype).float())
    ref = _scores(_engine(tiny_model))
    got = _scores(eng)
    assert got[0].token_ids == ref[0].token_ids
    diff = sum(abs(a.sequence_score - b.sequence_score) for a, b in zip(got, ref)) / len(ref)
    assert diff <= FP8_SCORE_TOL


@pytest.mark.parametrize(
    "grid,block,needle",
    [
        (
            (3, 2),
            [48, 48],
            r"layers\.1\.mlp\.down_proj.*grid \(3, 2\) does not fit weight_block_size \[48, 48\]",
        ),
        ((2, 3), None, r"_proj\.weight: block-wise .* has no weight_block_size"),
    ],
)
def test_block_scales_that_do_not_fit_name_the_tensor(
    block_fp8_model, tmp_path, grid, block, needle
):
    """A 2 x 3 grid fits the 64 x 128 down_proj at [48, 48]; a 3 x 2 one does not. The grid alone
    never decides the block size (64 rows in 2 blocks may be blocks of 32 or of 48)."""
    import json

    path, raw = block_fp8_model
    d = tmp_path / "badgrid"
    shutil.copytree(path, d)
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    assert raw[name].shape == (2, 3)
    save_file({**raw, name: torch.ones(grid)}, str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = block
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=needle):
        _engine(d)
