"""Gumbel top-k sampling (temperature > 0): the counter-based noise is Gumbel(0, 1), samples
follow softmax(total / T), and a request's noise depends on its seed, level, parent and code
only (never on the batch)."""

from __future__ import annotations

import math

import torch

from flashrec.beam.search import expand, gumbel_noise

N = 6000  # requests, one sample each


def _one_step(logits: list[float], temperature: float, seeds: torch.Tensor, level: int = 1):
    f = len(logits)
    b = seeds.shape[0]
    lp = torch.log_softmax(torch.tensor(logits), -1).expand(b, 1, f)
    codes = torch.arange(f).expand(b, 1, f)
    ones = torch.ones(b, 1, f, dtype=torch.bool)
    return expand(torch.zeros(b, 1), lp, codes, codes, ones, 1, temperature, seeds, level)


def test_top1_frequencies_follow_the_tempered_softmax():
    logits = [2.0, 1.0, 0.5, 0.0, -1.0]
    for temperature in (1.0, 0.5):
        res = _one_step(logits, temperature, torch.arange(N, dtype=torch.long))
        got = torch.bincount(res.codes[:, 0], minlength=len(logits)).double() / N
        want = torch.softmax(torch.tensor(logits, dtype=torch.float64) / temperature, -1)
        for g, p in zip(got.tolist(), want.tolist()):
            assert abs(g - p) <= 4 * math.sqrt(p * (1 - p) / N) + 1e-3, (temperature, got, want)


def test_noise_is_standard_gumbel():
    seeds = torch.arange(50, dtype=torch.long)
    codes = torch.arange(400).expand(50, 400)
    g = gumbel_noise(seeds, 2, torch.zeros_like(codes), codes).double()
    assert abs(g.mean().item() - 0.5772) < 0.02  # Euler-Mascheroni
    assert abs(g.var().item() - math.pi**2 / 6) < 0.05
    # different levels, parents or seeds: different noise (not one draw reused)
    other_level = gumbel_noise(seeds, 1, torch.zeros_like(codes), codes)
    other_parent = gumbel_noise(seeds, 2, torch.ones_like(codes), codes)
    assert (other_level != g.float()).float().mean() > 0.99
    assert (other_parent != g.float()).float().mean() > 0.99
    assert (g[1:] != g[:-1]).double().mean() > 0.99


def test_noise_of_a_request_does_not_depend_on_its_batch():
    seeds = torch.tensor([7, 2**61 + 3, 12345], dtype=torch.long)
    levels = torch.tensor([1, 2, 1])
    parents = torch.arange(4).view(1, 4, 1).expand(3, 4, 9)
    codes = torch.arange(9).view(1, 1, 9).expand(3, 4, 9)
    together = gumbel_noise(seeds, levels, parents, codes)
    for i in range(3):
        alone = gumbel_noise(seeds[i : i + 1], int(levels[i]), parents[:1], codes[:1])
        assert torch.equal(alone[0], together[i])


def test_scores_stay_noise_free_and_temperature_zero_is_greedy():
    logits = [0.3, 1.7, -0.2]
    seeds = torch.arange(64, dtype=torch.long)
    sampled = _one_step(logits, 1.0, seeds)
    lp = torch.log_softmax(torch.tensor(logits), -1)
    assert torch.equal(sampled.cum[:, 0], lp[sampled.codes[:, 0]])
    greedy = _one_step(logits, 0.0, seeds)
    assert (greedy.codes[:, 0] == 1).all()
