"""harness.spec.cells: axes x engines, link, exclude, scopes, grouping by server."""

from __future__ import annotations

from harness.spec.cells import evaluate, expand_cells, group_by_server, matches, select
from harness.spec.matrix import parse_spec

MATRIX = """\
engines:
  - {name: fr, kind: command, command: [python, x.py], args: {device: cpu}}
  - {name: sg, kind: external, url: "http://h:1", protocol: generate}
axes:
  beam_width: [4, 16]
  concurrency: [1, 4]
  quantization: [fp8, bf16]
link:
  batch_slots: "16 * beam_width"
  requests: "8 * concurrency"
exclude:
  - {beam_width: 16, concurrency: 4, quantization: bf16}
  - "beam_width == 4 and quantization == 'bf16' and concurrency == 4"
"""


def cells(text: str = MATRIX):
    spec, _ = parse_spec(text)
    return spec, expand_cells(spec)


def test_product_link_exclude():
    _, cs = cells()
    fr = [c for c in cs if c.engine.name == "fr"]
    assert len(fr) == 8 - 2
    ids = {c.id for c in fr}
    assert "fr,beam_width=16,concurrency=4,quantization=bf16" not in ids
    assert "fr,beam_width=4,concurrency=4,quantization=bf16" not in ids
    c = next(c for c in fr if c.id == "fr,beam_width=16,concurrency=1,quantization=fp8")
    assert c.params["batch_slots"] == 256
    assert c.server_args == {
        "device": "cpu",
        "beam_width": 16,
        "quantization": "fp8",
        "batch_slots": 256,
    }
    assert c.client.beam_width == 16 and c.client.concurrency == 1
    assert c.client.requests == 8  # linked client setting


def test_external_engine_drops_server_parameters():
    _, cs = cells()
    sg = [c for c in cs if c.engine.name == "sg"]
    assert sorted(c.id for c in sg) == sorted(
        f"sg,beam_width={b},concurrency={k}" for b in (4, 16) for k in (1, 4)
    )
    assert all(c.server_args == {} for c in sg)
    assert all("quantization" not in c.params for c in sg)


def test_server_level_axes_group_cells_client_axes_do_not():
    _, cs = cells()
    groups = group_by_server(cs)
    fr_groups = [g for g in groups if g[0].engine.name == "fr"]
    # beam_width (both) and quantization (server) restart; concurrency (client) does not
    assert len(fr_groups) == 4
    for g in fr_groups:
        assert len({(c.params["beam_width"], c.params["quantization"]) for c in g}) == 1
    assert sum(len(g) for g in groups) == len(cs)
    keys = [g[0].server_key for g in groups]
    assert len(keys) == len(set(keys)), "each server group runs once, back to back"


def test_axis_scope_override():
    spec, cs = cells(MATRIX + "axis_scope: {beam_width: client}\n")
    fr = [c for c in cs if c.engine.name == "fr"]
    assert all("beam_width" not in c.server_args for c in fr)
    assert len(group_by_server(fr)) == 4  # the linked batch_slots still follows beam_width
    no_link = MATRIX.replace('  batch_slots: "16 * beam_width"\n', "")
    spec, cs = cells(no_link + "axis_scope: {beam_width: client}\n")
    fr = [c for c in cs if c.engine.name == "fr"]
    assert len(group_by_server(fr)) == 2  # quantization only


def test_evaluate_is_restricted():
    assert evaluate("max(2, 16 * n) // 4", {"n": 3}) == 12
    assert evaluate("n in [1, 2] and not false", {"n": 2}) is True
    for bad in ("__import__('os')", "n.real", "open('x')"):
        try:
            evaluate(bad, {"n": 1})
        except ValueError:
            continue
        raise AssertionError(bad)


def test_filters_and_select():
    spec, cs = cells(MATRIX + "trace: {cells: first}\n")
    params = {"engine": "fr", "beam_width": 16, "concurrency": 4}
    assert matches("fr,beam_width=16,concurrency=4", params, "beam_width=16,concurrency=4")
    assert matches("fr,beam_width=16,concurrency=4", params, "beam_width=1*")
    assert not matches("fr,beam_width=16,concurrency=4", params, "beam_width=4")
    assert matches("fr,beam_width=16,concurrency=4", params, "*16,conc*")
    assert matches("fr,beam_width=16,concurrency=4", params, "fr,")
    assert cs[0].traced and sum(c.traced for c in cs) == 1
    chosen = select(spec, cs, ["engine=sg"])
    assert chosen and all(c.engine.name == "sg" for c in chosen)
    assert chosen[0].traced, "trace: first follows the selection"


FLASHREC = """\
engine: {name: fr, kind: flashrec, device: cpu}
model: {preset: tiny}
cells:
  - {beam_width: 4, concurrency: 1, engine_process: off, overlap_results: false}
  - {beam_width: 4, concurrency: 1, engine_process: on, overlap_results: true}
"""


def test_flashrec_cells_take_yaml_on_off_as_words():
    """YAML 1.1 reads unquoted on / off as booleans: an option whose choices are on / off gets
    the word back (not --no-engine-process, which flashrec serve does not have); a real
    boolean option keeps its --flag / --no-flag form."""
    from harness.spec.serve_args import flags

    _, cs = cells(FLASHREC)
    got = {c.id: flags(c.server_args) for c in cs}
    assert got == {
        "fr,beam_width=4,concurrency=1,engine_process=false,overlap_results=false": [
            "--beam-width", "4", "--engine-process", "off", "--no-overlap-results",
        ],
        "fr,beam_width=4,concurrency=1,engine_process=true,overlap_results=true": [
            "--beam-width", "4", "--engine-process", "on", "--overlap-results",
        ],
    }  # fmt: skip


def test_flashrec_flags_its_server_rejects_fail_the_matrix_at_load():
    """A flag flashrec serve would reject (unknown, or out of its range) fails expansion with
    the cell and flashrec's own message, before any server starts (and in --dry-run)."""
    import pytest

    from harness.spec.matrix import SpecError

    for extra, words in (
        ("respond_workers: 99", "--respond-workers must be in 0..64, got 99"),
        ("bogus_knob: 3", "unrecognized arguments: --bogus-knob 3"),
        ("kv_cache_dtype: fp4", "invalid choice: 'fp4'"),
    ):
        text = FLASHREC.replace("overlap_results: true", extra)
        with pytest.raises(SpecError) as err:
            cells(text)
        assert "fr,beam_width=4,concurrency=1,engine_process=true" in err.value.message
        assert words in err.value.message, err.value.message
