"""Named catalogs of a matrix (``catalogs:``) and the ``catalog`` cell parameter: spec
parsing and its errors, a launched FlashRec's argv, request bodies, the per-cell SID check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.load.client import Request, chat_body, generate_body
from harness.load.loop import make_requests
from harness.load.workload import Prompt
from harness.run.campaign import RunOptions, _Campaign, plan
from harness.run.progress import Progress
from harness.servers.launch import LaunchedServer
from harness.spec.cells import expand_cells
from harness.spec.load import load_cells
from harness.spec.matrix import SpecError, parse_spec
from harness.spec.model import ModelError, resolve_model


def write_catalog(path: Path, sids: list[tuple[int, ...]]) -> str:
    from flashrec.synth.catalog import write_catalog_json

    return str(write_catalog_json(sids, path))


@pytest.fixture
def cats(tmp_path) -> dict[str, str]:
    """Two disjoint catalogs of different sizes: small (3 SIDs), big (5 SIDs)."""
    small = write_catalog(tmp_path / "small.json", [(1, 2, 3), (4, 5, 6), (7, 8, 9)])
    big = write_catalog(tmp_path / "big.json", [(10, 11, 12 + i) for i in range(5)])
    return {"small": small, "big": big}


def matrix(tmp_path: Path, cats: dict, **extra) -> dict:
    (tmp_path / "model").mkdir(exist_ok=True)
    m = {
        "engines": [
            {"name": "fr", "kind": "flashrec", "device": "cpu"},
            {
                "name": "ext",
                "kind": "external",
                "url": "http://127.0.0.1:9",
                "protocol": "generate",
            },
        ],
        "model": {"path": str(tmp_path / "model")},
        "catalogs": cats,
        "axes": {"catalog": list(cats), "concurrency": [1]},
    }
    m.update(extra)
    return m


def spec_of(m: dict):
    return parse_spec(yaml.safe_dump(m, sort_keys=False), "m.yaml")[0]


def load_error(tmp_path: Path, m: dict) -> SpecError:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    with pytest.raises(SpecError) as exc:
        load_cells(str(path))
    return exc.value


def test_cells_carry_their_catalog_and_flashrec_gets_every_file(tmp_path, cats):
    spec = spec_of(matrix(tmp_path, cats))
    cells = expand_cells(spec)
    by_id = {c.id: c for c in cells}
    assert set(by_id) == {
        "fr,catalog=small,concurrency=1",
        "fr,catalog=big,concurrency=1",
        "ext,catalog=small,concurrency=1",
        "ext,catalog=big,concurrency=1",
    }
    for c in cells:
        assert c.client.catalog == c.params["catalog"]
        assert "catalog" not in c.server_args  # a client setting: one server for both cells
    fr = [c for c in cells if c.engine.name == "fr"]
    assert fr[0].server_key == fr[1].server_key
    model = resolve_model(spec)
    assert model.catalog == cats["small"]  # the default: the first
    assert [(n, p) for n, p, _ in model.catalogs] == list(cats.items())
    assert all(h for _, _, h in model.catalogs)
    argv = LaunchedServer(fr[0].engine, fr[0].server_args, model, tmp_path / "l").command()
    i = [k for k, a in enumerate(argv) if a == "--sid-vocab-file"]
    assert [argv[k + 1] for k in i] == [f"small={cats['small']}", f"big={cats['big']}"]
    shown = plan(spec, cells, None)  # --dry-run
    assert f"--sid-vocab-file small={cats['small']} --sid-vocab-file big={cats['big']}" in shown


def test_requests_carry_the_catalog_on_both_protocols(tmp_path, cats):
    cells = expand_cells(spec_of(matrix(tmp_path, cats)))
    cell = next(c for c in cells if c.params["catalog"] == "big")
    reqs = make_requests([Prompt(0, [{"role": "user", "content": "x"}])], cell.client, 4, None, "m")
    assert chat_body(reqs[0])["catalog"] == "big"
    req = Request(Prompt(0, []), 4, 4, 0.0, text="t", catalog="big")
    body = generate_body(req)
    assert body["sampling_params"]["catalog"] == "big" and "catalog" not in body
    # no name: no key at all (an upstream SGLang refuses unknown sampling_params)
    plain = Request(Prompt(0, []), 4, 4, 0.0, text="t")
    assert "catalog" not in chat_body(plain)
    assert "catalog" not in generate_body(plain)["sampling_params"]


def test_the_sid_check_of_a_cell_uses_its_catalog(tmp_path, cats):
    spec = spec_of(matrix(tmp_path, cats))
    cells = {c.params["catalog"]: c for c in expand_cells(spec) if c.engine.name == "fr"}
    camp = _Campaign(spec, RunOptions(tmp_path / "out"), Progress(2), resolve_model(spec))
    small, big = camp.checker_for(cells["small"]), camp.checker_for(cells["big"])
    one_small, one_big = "<s_a_1><s_b_2><s_c_3>", "<s_a_10><s_b_11><s_c_14>"
    assert small.check([one_small, one_big]).invalid == 1
    assert big.check([one_small, one_big]).invalid == 1
    assert big.check([one_big]).invalid == 0 and small.check([one_small]).invalid == 0
    assert len(big.catalog) == 5 and len(small.catalog) == 3
    assert camp.catalog_path(cells["big"]) == cats["big"]


def test_an_unreadable_named_catalog_fails_the_campaign(tmp_path, cats):
    cats = {**cats, "gone": str(tmp_path / "nowhere.json")}
    spec = spec_of(matrix(tmp_path, cats))
    cell = next(c for c in expand_cells(spec) if c.params["catalog"] == "gone")
    camp = _Campaign(spec, RunOptions(tmp_path / "out"), Progress(1), resolve_model(spec))
    with pytest.raises(ModelError, match="cannot read catalog 'gone'"):
        camp.checker_for(cell)


@pytest.mark.parametrize(
    "where",
    ["axes", "cells", "link"],
)
def test_an_undeclared_name_is_a_spec_error_naming_the_declared_ones(tmp_path, cats, where):
    m = matrix(tmp_path, cats)
    del m["axes"]
    if where == "axes":
        m["axes"] = {"catalog": ["small", "videos"]}
    elif where == "cells":
        m["cells"] = [{"catalog": "small"}, {"catalog": "videos"}]
    else:
        m["axes"] = {"concurrency": [1]}
        m["link"] = {"catalog": "'videos' if concurrency == 1 else 'small'"}
    err = load_error(tmp_path, m)
    assert "catalog 'videos' is not declared in 'catalogs:' (declared: small, big)" in str(err)
    assert err.field.startswith(where) and err.line > 0


def test_a_catalog_without_declared_catalogs(tmp_path, cats):
    m = matrix(tmp_path, cats)
    del m["catalogs"]
    err = load_error(tmp_path, m)
    assert "the matrix declares none" in str(err) and err.field == "axes.catalog"


@pytest.mark.parametrize(
    ("catalogs", "extra", "message"),
    [
        ({"bad name": "x.json"}, {}, "catalog name 'bad name'"),
        ({"-x": "x.json"}, {}, "catalog name '-x'"),
        ({"a": ""}, {}, "catalog 'a' has no path"),
        ({"a": "x.json"}, {"catalog": {"path": "y.json"}}, "not both"),
    ],
)
def test_bad_catalogs_sections(tmp_path, catalogs, extra, message):
    m = matrix(tmp_path, catalogs, **extra)
    m["axes"] = {"concurrency": [1]}
    err = load_error(tmp_path, m)
    assert message in str(err) and err.field == "catalogs" and err.line > 0


def test_a_command_engine_serves_the_default_alone(tmp_path, cats):
    peer = {"name": "sg", "kind": "command", "command": ["python", "x.py"]}
    m = matrix(tmp_path, cats, engines=[peer])
    err = load_error(tmp_path, m)
    assert "takes no catalog name" in str(err) and "'big'" in str(err)
    # the default alone: allowed, and its requests carry no name (the peer would refuse one)
    m["axes"] = {"catalog": ["small"]}
    spec = spec_of(m)
    (cell,) = expand_cells(spec)
    assert cell.params["catalog"] == "small" and cell.client.catalog is None
    argv = LaunchedServer(cell.engine, cell.server_args, resolve_model(spec), tmp_path / "l")
    cmd = argv.command()
    assert cmd[cmd.index("--sid-vocab-file") + 1] == cats["small"]  # the default's file


def test_catalogs_beside_a_catalog_levels_section(tmp_path, cats):
    spec = spec_of(matrix(tmp_path, cats, catalog={"levels": 3}))
    assert resolve_model(spec).catalog == cats["small"]


def test_load_catalog_names_every_cells_catalog(tmp_path, cats):
    m = matrix(tmp_path, cats, load={"catalog": "big"})
    m["axes"] = {"concurrency": [1, 2]}
    cells = expand_cells(spec_of(m))
    assert {c.client.catalog for c in cells} == {"big"}
    m["axes"] = {"catalog": ["small"], "concurrency": [1]}  # a cell's own over load's
    assert {c.client.catalog for c in expand_cells(spec_of(m))} == {"small"}
    m["axes"] = {"concurrency": [1]}
    m["load"] = {"catalog": "nope"}
    err = load_error(tmp_path, m)
    assert err.field == "load.catalog" and "declared: small, big" in str(err)
