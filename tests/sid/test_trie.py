"""SidTrie: the CSR walk enumerates the catalog; dense and sparse masks agree; membership."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flashrec.sid.catalog import unique_rows
from flashrec.sid.trie import SidTrie


@st.composite
def catalogs(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """Random ``(codes [N, depth], K)`` with duplicates and shared prefixes likely."""
    k = draw(st.integers(1, 12))
    depth = draw(st.integers(1, 4))
    n = draw(st.integers(1, 60))
    codes = draw(arrays(np.int64, (n, depth), elements=st.integers(0, k - 1)))
    return codes, k


def walk(trie: SidTrie) -> tuple[list[tuple[int, ...]], list[int]]:
    """Every full path from the root through ``candidates``, and its leaf node id."""
    prefixes: list[tuple[int, ...]] = [()]
    nodes = torch.zeros(1, dtype=torch.long)
    for level in range(trie.depth):
        codes, child, valid = trie.candidates(level, nodes)
        assert codes.shape == child.shape == valid.shape == (len(nodes), trie.max_fanout[level])
        assert not codes[~valid].any() and not child[~valid].any()
        rows, slots = valid.nonzero(as_tuple=True)
        prefixes = [(*prefixes[r], int(codes[r, s])) for r, s in zip(rows.tolist(), slots.tolist())]
        nodes = child[rows, slots]
    return prefixes, nodes.tolist()


def scattered_mask(trie: SidTrie, level: int, nodes: torch.Tensor) -> torch.Tensor:
    codes, _, valid = trie.candidates(level, nodes)
    mask = torch.zeros(len(nodes), trie.codebook_size, dtype=torch.bool)
    for r, s in valid.nonzero().tolist():
        mask[r, codes[r, s]] = True
    return mask


@settings(max_examples=150, deadline=None)
@given(catalogs())
def test_walk_enumerates_catalog(catalog: tuple[np.ndarray, int]) -> None:
    codes, k = catalog
    trie = SidTrie(codes, k)
    expected = unique_rows(codes)[0]
    sids, leaves = walk(trie)
    assert sids == [tuple(row) for row in expected.tolist()]  # sorted, each exactly once
    assert leaves == list(range(len(expected)))  # leaf id = row of the sorted catalog
    assert trie.count() == len(trie) == len(expected) == trie.num_nodes(trie.depth)
    for level in range(trie.depth):
        assert trie.ptr[level].shape == (trie.num_nodes(level) + 1,)
        assert trie.child[level].shape == (trie.num_nodes(level + 1),)
        assert trie.max_fanout[level] == int(trie.ptr[level].diff().max())


@settings(max_examples=150, deadline=None)
@given(catalogs())
def test_masks_agree_dense_and_csr(catalog: tuple[np.ndarray, int]) -> None:
    codes, k = catalog
    dense = SidTrie(codes, k)
    csr = SidTrie(torch.from_numpy(codes), k, dense_limit=0)
    for level in range(dense.depth):
        n = dense.num_nodes(level)
        nodes = torch.cat([torch.arange(n), torch.arange(n).flip(0)])  # repeats, any order
        reference = scattered_mask(dense, level, nodes)
        assert torch.equal(dense.valid_mask(level, nodes), reference)
        assert torch.equal(csr.valid_mask(level, nodes), reference)
        for got, want in zip(csr.candidates(level, nodes), dense.candidates(level, nodes)):
            assert torch.equal(got, want)


@settings(max_examples=150, deadline=None)
@given(catalogs(), st.data())
def test_contains(catalog: tuple[np.ndarray, int], data: st.DataObject) -> None:
    codes, k = catalog
    trie = SidTrie(codes, k)
    queries = data.draw(
        arrays(np.int64, (data.draw(st.integers(1, 30)), trie.depth), elements=st.integers(-1, k))
    )
    queries = np.concatenate([queries, codes])
    members = {tuple(row) for row in codes.tolist()}
    expected = [tuple(row) in members for row in queries.tolist()]
    assert trie.contains(queries).tolist() == expected
    prefixes = {row[:1] for row in members}
    assert trie.contains(queries[:, :1]).tolist() == [tuple(r[:1]) in prefixes for r in queries]


def test_step_follows_edges() -> None:
    trie = SidTrie(np.array([[3, 1], [3, 4], [0, 2]]), 5)
    child, found = trie.step(0, torch.tensor([0, 0, 0]), torch.tensor([3, 1, 0]))
    assert found.tolist() == [True, False, True] and child.tolist() == [1, 0, 0]
    child, found = trie.step(1, torch.tensor([1, 1, 0]), torch.tensor([4, 2, 2]))
    assert found.tolist() == [True, False, True] and child.tolist() == [2, 0, 0]


def test_to_device_copy_and_errors() -> None:
    trie = SidTrie(np.array([[1, 2], [1, 3]]), 4)
    moved = trie.to("cpu")
    assert moved is not trie and moved.count() == 2 and moved.device == torch.device("cpu")
    assert torch.equal(
        moved.valid_mask(1, torch.tensor([0])), trie.valid_mask(1, torch.tensor([0]))
    )
    with pytest.raises(ValueError, match="outside"):
        SidTrie(np.array([[1, 4]]), 4)
    with pytest.raises(ValueError, match="non-empty"):
        SidTrie(np.zeros((0, 3), dtype=np.int64), 4)
    with pytest.raises(ValueError, match="codes with 1 <= d <= 2"):
        trie.contains(np.array([[1, 2, 3]]))


def test_large_random_catalog_builds_fast() -> None:
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 8192, size=(200_000, 3))
    trie = SidTrie(codes, 8192)
    assert trie.count() == len(unique_rows(codes)[0])
    assert trie.contains(codes[:1000]).all()
    assert trie._dense[0] is not None and trie._dense[2] is None  # only small levels go dense


def check_graph_replay(trie: SidTrie, level: int, rows: int = 32) -> None:
    """Capture candidates/valid_mask/step at ``level`` once; replays must match eager calls."""
    nodes = torch.zeros(rows, dtype=torch.long, device="cuda")
    pick = torch.zeros(rows, dtype=torch.long, device="cuda")

    def body() -> tuple[torch.Tensor, ...]:
        cand, child, valid = trie.candidates(level, nodes)
        step, found = trie.step(level, nodes, pick)
        return cand, child, valid, trie.valid_mask(level, nodes), step, found

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = body()
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        nodes.copy_(torch.randint(0, trie.num_nodes(level), (rows,), device="cuda", generator=gen))
        pick.copy_(torch.randint(0, trie.codebook_size, (rows,), device="cuda", generator=gen))
        graph.replay()
        for got, want in zip(static_out, body()):
            assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_and_replay() -> None:
    """The trie's per-step ops are graph-safe on both the dense and the CSR mask path."""
    codes = np.random.default_rng(0).integers(0, 64, size=(5000, 3))
    for dense_limit in (1 << 24, 0):
        trie = SidTrie(codes, 64, device="cuda", dense_limit=dense_limit)
        for level in range(trie.depth):
            check_graph_replay(trie, level)
