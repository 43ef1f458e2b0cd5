"""Synthetic models with a calibrated next-SID confidence (``flashrec synth --sid-entropy``)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flashrec.synth import TokenLayout, add_synth_args, build_checkpoint, run_synth, synth_prompts
from flashrec.synth.confidence import NUM_PROMPTS, PROMPT_TOKENS, entropy, solve_scale

transformers = pytest.importorskip("transformers")

K, L = 64, 3  # tiny preset
LAYOUT = TokenLayout(K, L)
TOL = 0.01  # nats
# content_hash of the tiny preset, seed 0, float32, built before the option existed
TINY_SEED0_HASH = "8f715781fad07110d63bfccb2447d62162deeb60018072c437541994db6c3651"


def _info(path: Path) -> dict:
    return json.loads((path / "synth_info.json").read_text())


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("plain"), "tiny", seed=0)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("cal3"), "tiny", seed=0, sid_entropy=3.0)


def _hf_mean_entropy(path: Path) -> tuple[float, list[float]]:
    """Mean level-scope entropy of the written checkpoint, through HF transformers.

    Same prompt set as the calibration, but the chat template, tokenizer and forward are HF's;
    level l > 0 follows the greedy codes of the earlier levels.
    """
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    hs = []
    for messages in synth_prompts(NUM_PROMPTS, median_tokens=PROMPT_TOKENS, seed=0):
        text = tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        ids = tok(text + "<|sid_begin|>", return_tensors="pt").input_ids
        row = []
        for level in range(L):
            with torch.no_grad():
                logits = model(ids).logits[0, -1].double()
            lo = LAYOUT.code_id(level, 0)
            z = logits[lo : lo + K]
            row.append(float(entropy(z)))
            nxt = torch.tensor([[LAYOUT.code_id(level, int(z.argmax()))]])
            ids = torch.cat([ids, nxt], 1)
        hs.append(row)
    per_level = torch.tensor(hs).mean(0)
    return float(per_level.mean()), [float(h) for h in per_level]


def test_default_build_unchanged(plain):
    info = _info(plain)
    assert info["content_hash"] == TINY_SEED0_HASH
    assert "sid_entropy" not in info


@pytest.mark.parametrize("target", [3.0, 2.0])
def test_achieved_entropy_matches_target(tmp_path, plain, target):
    out = build_checkpoint(tmp_path, "tiny", seed=0, sid_entropy=target)
    rec = _info(out)["sid_entropy"]
    assert rec["target"] == target
    assert abs(rec["achieved"] - target) < TOL
    assert abs(sum(rec["achieved_per_level"]) / L - rec["achieved"]) < 1e-5
    # the tiny preset at random init is far more confident than either target
    assert rec["uncalibrated"] < target - 0.5
    # only model.norm.weight changed, by exactly the recorded scale
    a, b = load_file(plain / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        if name == "model.norm.weight":
            assert torch.equal(b[name], a[name] * rec["scale"])
        else:
            assert torch.equal(a[name], b[name]), name
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (plain / f).read_bytes() == (out / f).read_bytes()


def test_written_checkpoint_entropy_via_hf(calibrated, plain):
    rec = _info(calibrated)["sid_entropy"]
    mean, per_level = _hf_mean_entropy(calibrated)
    assert abs(mean - 3.0) < TOL
    assert all(abs(h - r) < TOL for h, r in zip(per_level, rec["achieved_per_level"]))
    before, _ = _hf_mean_entropy(plain)
    assert abs(before - rec["uncalibrated"]) < TOL


def test_same_scale_for_every_dtype(tmp_path, calibrated):
    g = _info(calibrated)["sid_entropy"]["scale"]
    for dtype in ("bf16", "fp8"):
        out = build_checkpoint(tmp_path / dtype, "tiny", seed=0, dtype=dtype, sid_entropy=3.0)
        assert _info(out)["sid_entropy"]["scale"] == g
    again = build_checkpoint(tmp_path / "again", "tiny", seed=0, sid_entropy=3.0)
    assert _info(again)["content_hash"] == _info(calibrated)["content_hash"]


def test_solve_scale_and_range():
    z = torch.randn(4, 3, 512, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for target in (1.0, 4.0):
        g = solve_scale(z, target)
        assert abs(float(entropy(z * g).mean()) - target) < 1e-3
    with pytest.raises(ValueError, match="sid_entropy"):
        solve_scale(z, math.log(512) + 0.1)
    with pytest.raises(ValueError, match="sid_entropy"):
        solve_scale(z, 0.0)


def test_cli_option(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_synth_args(parser)
    args = parser.parse_args(["--out", str(tmp_path / "m"), "--sid-entropy", "2.5"])
    assert run_synth(args) == 0
    err = capsys.readouterr().err
    rec = _info(tmp_path / "m")["sid_entropy"]
    assert f"{rec['uncalibrated']:.3f} nats uncalibrated -> {rec['achieved']:.3f}" in err
    assert abs(rec["achieved"] - 2.5) < TOL
    bad = parser.parse_args(["--out", str(tmp_path / "x"), "--sid-entropy", "5"])  # > ln 64
    assert run_synth(bad) == 2


def test_harness_model_section_passes_it_through(tmp_path, monkeypatch):
    from harness.spec.matrix import parse_spec
    from harness.spec.model import ModelError, preset_key, resolve_model

    monkeypatch.setenv("FLASHREC_CACHE", str(tmp_path / "cache"))

    def spec(**model):
        engine = {"kind": "external", "url": "http://x"}
        return parse_spec(json.dumps({"engine": engine, "model": model}))[0]

    cal = spec(preset="tiny", sid_entropy=2.0)
    assert cal.model.sid_entropy == 2.0
    keys = {preset_key(spec(preset="tiny", **kw).model, None) for kw in ({}, {"sid_entropy": 2.0})}
    keys.add(preset_key(spec(preset="tiny", sid_entropy=3.0).model, None))
    assert len(keys) == 3
    m = resolve_model(cal, log=lambda _: None)
    rec = _info(Path(m.path))["sid_entropy"]
    assert rec["target"] == 2.0 and abs(rec["achieved"] - 2.0) < TOL
    assert "sid_entropy" not in _info(Path(resolve_model(spec(preset="tiny")).path))
    # a path with sid_entropy: only a model calibrated to that entropy (synth_info.json says)
    with pytest.raises(ModelError, match="no synth_info.json records"):
        resolve_model(spec(path=str(tmp_path), sid_entropy=2.0))
    assert resolve_model(spec(path=m.path, sid_entropy=2.0)).path == m.path
    with pytest.raises(ModelError, match="calibrated to 2.0"):
        resolve_model(spec(path=m.path, sid_entropy=3.0))
    plain_path = resolve_model(spec(preset="tiny")).path
    with pytest.raises(ModelError, match="no synth_info.json records"):
        resolve_model(spec(path=plain_path, sid_entropy=2.0))
    with pytest.raises(Exception, match="sid_entropy"):
        spec(preset="tiny", sid_entropy=-1)
