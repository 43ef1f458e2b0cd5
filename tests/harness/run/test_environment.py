"""harness.run.environment: a dirty checkout still names the code it ran (its files' git tree)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from harness.report.build import resumed_note
from harness.run.environment import git_info, working_tree

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(cwd, *args) -> str:
    out = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_dirty_tree_over_an_old_history_equals_the_commit_with_those_files(tmp_path):
    """A working tree laid over an older .git (edited files, new untracked ones, an ignored
    one): ``tree`` equals the tree of the commit that holds exactly those files elsewhere,
    and the checkout's own index is left as it was."""
    old = tmp_path / "device"
    old.mkdir()
    _git(old, "init", "-q")
    (old / ".gitignore").write_text("*.whl\n")
    (old / "a.py").write_text("x = 1\n")
    _git(old, "add", "-A")
    _git(old, "commit", "-qm", "old")
    # the newer commit, made in another repository from the same start
    new = tmp_path / "dev"
    shutil.copytree(old, new)
    (new / "a.py").write_text("x = 2\n")
    (new / "b.py").write_text("y = 3\n")
    _git(new, "add", "-A")
    _git(new, "commit", "-qm", "new")
    want = _git(new, "rev-parse", "HEAD^{tree}")
    # the device: the old history, the new files, plus an ignored file
    (old / "a.py").write_text("x = 2\n")
    (old / "b.py").write_text("y = 3\n")
    (old / "wheel.whl").write_text("binary")
    working_tree.cache_clear()
    info = git_info(str(old))
    assert info["dirty"] is True
    assert info["commit"] == _git(old, "rev-parse", "HEAD")  # still the old commit
    assert info["tree"] == want != _git(old, "rev-parse", "HEAD^{tree}")
    status = {line.strip() for line in _git(old, "status", "--porcelain").splitlines()}
    assert status == {"M a.py", "?? b.py"}  # its own index untouched: b.py still untracked
    clean = git_info(str(new))
    assert clean["dirty"] is False and clean["tree"] is None


def test_resumed_note_flags_another_tree_on_the_same_commit():
    here = {"host": "h", "gpu": "G", "git": "c" * 40, "tree": "a" * 40}
    same = dict(here, at="t", dirty=True)
    assert "not this report" not in resumed_note(same, here)
    assert "tree aaaaaaa" in resumed_note(same, here)
    other = dict(same, tree="b" * 40)
    assert "(not this report's commit)" in resumed_note(other, here)


def test_resumed_note_names_the_declared_commit_of_a_tree_without_git():
    """A tree copied to the GPU machine without its .git (FLASHREC_SOURCE_COMMIT set): the
    note names the declared commit, and a cell declared at another commit is flagged."""
    here = {"host": "h", "gpu": "G", "git": None, "tree": None, "declared": "9d46e08"}
    cell = dict(here, at="t", declared="01742c3")
    note = resumed_note(cell, here)
    assert "git ? (declared source commit 01742c3)" in note
    assert note.endswith("(not this report's commit)")
    assert "not this report" not in resumed_note(dict(cell, declared="9d46e08"), here)


def test_host_probe_times_the_answer_body_and_reaches_the_header_and_stamps(monkeypatch):
    """The run records how fast its host encodes a 256-beam answer (host phases differ by
    machine), in the environment, in each cell's ``measured`` stamp and in the report header."""
    import json
    import time

    import harness.run.environment as env
    from harness.report.render import header_lines

    env.host_probe.cache_clear()
    env.machine.cache_clear()
    real = json.dumps

    def slow(obj, *a, **k):  # a host 2 ms slower per encoding
        time.sleep(0.002)
        return real(obj, *a, **k)

    monkeypatch.setattr(env.json, "dumps", slow)
    slow_ms = env.host_probe()["json_256_beams_ms"]
    monkeypatch.setattr(env.json, "dumps", real)
    env.host_probe.cache_clear()
    probe = env.host_probe()
    assert 0 < probe["json_256_beams_ms"] < slow_ms
    assert slow_ms >= 2.0
    assert env.measured_stamp()["host_probe_ms"] == probe["json_256_beams_ms"]
    e = env.environment({}, None, None)
    assert e["host_probe"] == probe
    report = {"run_id": "r", "created": "t", "environment": e}
    line = next(x for x in header_lines(report) if x.startswith("host CPU"))
    assert f"{probe['json_256_beams_ms']:.3f} ms" in line
    assert str(probe["cpu_model"] or "?") in line


def test_host_probe_reads_the_host_not_a_burst_of_other_work(monkeypatch):
    """Other work during the first third of the probe (a server starting, a baseline loading
    its model) does not set the figure: the fastest sample does."""
    import json
    import time

    import harness.run.environment as env

    real, calls = json.dumps, []

    def busy_at_first(obj, *a, **k):  # the first 50 of 150 encodings 2 ms slower
        calls.append(1)
        if len(calls) <= 50:
            time.sleep(0.002)
        return real(obj, *a, **k)

    env.host_probe.cache_clear()
    monkeypatch.setattr(env.json, "dumps", busy_at_first)
    try:
        probe = env.host_probe()["json_256_beams_ms"]
    finally:
        env.host_probe.cache_clear()
    assert len(calls) == 150
    assert 0 < probe < 2.0


def test_runs_take_the_host_probe_before_building_a_model(monkeypatch, tmp_path):
    """run_matrix measures the probe first (a quiet host), before the model is resolved
    (which may synthesize one) and before any server starts."""
    from types import SimpleNamespace

    import harness.run.campaign as campaign

    order = []
    monkeypatch.setattr(campaign, "take_host_probe", lambda: order.append("probe"))

    def stop(*a, **k):
        order.append("model")
        raise RuntimeError("stop here")

    monkeypatch.setattr(campaign, "resolve_model", stop)
    monkeypatch.setattr(campaign, "select", lambda spec, cells, only: cells)
    with pytest.raises(RuntimeError, match="stop here"):
        campaign.run_matrix(None, [], SimpleNamespace(only=[]), SimpleNamespace(message=print))
    assert order == ["probe", "model"]


def test_declared_source_commit_reaches_the_environment_stamp_and_header(monkeypatch):
    """FLASHREC_SOURCE_COMMIT (set where a working tree is laid over another .git) is kept as
    declared, in the environment, in each cell's stamp and in the header; unset, nothing."""
    import harness.run.environment as env
    from harness.report.render import header_lines

    commit = "a663b51c60da4e68ad620938c92ec96048cceb08"
    monkeypatch.setenv(env.SOURCE_COMMIT_ENV, f" {commit}\n")
    env.machine.cache_clear()
    e = env.environment({}, None, None)
    assert e["git"]["declared"] == commit
    assert env.measured_stamp()["declared"] == commit
    head = next(
        x
        for x in header_lines({"run_id": "r", "created": "t", "environment": e})
        if x.startswith("git ")
    )
    assert f"declared source commit {commit}" in head and "not checked" in head
    monkeypatch.delenv(env.SOURCE_COMMIT_ENV)
    env.machine.cache_clear()
    e = env.environment({}, None, None)
    assert e["git"]["declared"] is None and env.measured_stamp()["declared"] is None
    head = next(
        x
        for x in header_lines({"run_id": "r", "created": "t", "environment": e})
        if x.startswith("git ")
    )
    assert "declared" not in head
    env.machine.cache_clear()
