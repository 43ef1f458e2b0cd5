"""docs/harness-reference.md against the matrix spec models, and the guide's examples."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.spec.load import load_cells

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "harness.md"
DOCS = [GUIDE, *sorted((ROOT / "docs" / "harness").glob("*.md"))]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_harness_docs", ROOT / "scripts" / "gen_harness_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_harness_reference_is_fresh():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_harness_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_a_reference_lacking_a_key_fails_the_check(tmp_path):
    gen = _generator()
    text = gen.REFERENCE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `load.rounds` |"))
    stale = tmp_path / "harness-reference.md"
    stale.write_text(text.replace(row + "\n", ""))
    problems = gen.check(stale)
    assert "lacks key load.rounds" in problems
    assert any(p.startswith("stale") for p in problems)


def test_a_model_key_the_reference_lacks_fails(monkeypatch):
    """A key added to a model is missing from today's reference, and has no description."""
    from harness.spec.matrix import LoadSpec, MatrixSpec

    gen = _generator()

    class NewLoad(LoadSpec):
        ramp_s: float = 0.0

    class NewMatrix(MatrixSpec):
        load: NewLoad = NewLoad()

    assert gen.missing_keys(gen.REFERENCE.read_text(), NewMatrix) == ["load.ramp_s"]
    with pytest.raises(SystemExit, match="load.ramp_s"):
        gen.render(NewMatrix)
    monkeypatch.setitem(gen.DESCRIPTIONS, "load.ramp_s", "ramp-up before the round")
    assert "| `load.ramp_s` | float | `0` | ramp-up before the round |" in gen.render(NewMatrix)


def test_a_description_for_no_key_fails(monkeypatch):
    gen = _generator()
    monkeypatch.setitem(gen.DESCRIPTIONS, "load.roudns", "typo")
    with pytest.raises(SystemExit, match="load.roudns"):
        gen.render()


def _matrix_examples() -> list[tuple[str, str]]:
    """Every ```yaml block of the guide and topic pages that is a whole matrix (has an engine)."""
    out = []
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            if re.search(r"^engines?:", block, re.M):
                out.append((f"{doc.name}#{i}", block))
    return out


def test_the_guide_has_a_matrix_example():
    assert any(name.startswith("harness.md") for name, _ in _matrix_examples())


@pytest.mark.parametrize("name,text", _matrix_examples(), ids=[n for n, _ in _matrix_examples()])
def test_every_matrix_example_validates(name, text, tmp_path):
    path = tmp_path / "example.yaml"
    path.write_text(text)
    spec, cells = load_cells(str(path))
    assert cells, name


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", doc.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_the_guide_links_resolve():
    """Relative links of the guide, topic pages and reference name files and headings that exist."""
    for doc in DOCS + [ROOT / "docs" / "harness-reference.md"]:
        for target, anchor in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", doc.read_text()):
            path = (doc.parent / target) if target else doc
            assert path.exists(), f"{doc.name}: {target}"
            if anchor:
                assert anchor in _anchors(path), f"{doc.name}: {target}#{anchor}"
