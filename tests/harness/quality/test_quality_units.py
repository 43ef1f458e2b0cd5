"""Metric definitions, intervals, the PID mapping, dataset reading and official detection."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from harness.quality.dataset import OFFICIAL_SIZES, load_dataset, official_check
from harness.quality.metrics import bootstrap_mean, sample_metrics, summarize_metric, wilson
from harness.quality.pids import load_pid_map, pack

A, B, C, D = (1, 2, 3), (4, 5, 6), (7, 8, 9), (1, 1, 1)


def test_metrics_follow_the_benchmark_definitions():
    m = sample_metrics([B, A, None, C], [A, C, D], [1, 2, 4])
    assert (m["pass@1"], m["pass@2"]) == (0.0, 1.0)
    assert (m["position1_pass@1"], m["position1_pass@2"]) == (0.0, 1.0)  # A is the first truth
    assert m["recall@2"] == pytest.approx(1 / 3) and m["recall@4"] == pytest.approx(2 / 3)
    # the first truth found only by a later beam: pass@k but not position1_pass@k
    m = sample_metrics([C], [A, C], [1])
    assert m["pass@1"] == 1.0 and m["position1_pass@1"] == 0.0 and m["recall@1"] == 0.5
    # duplicates keep their slot (first_k): the second beam does not reach B
    assert sample_metrics([A, A, B], [B], [2])["pass@2"] == 0.0
    assert sample_metrics([], [A], [1])["recall@1"] == 0.0
    assert sample_metrics([A], [], [1]) == {"pass@1": 0.0, "position1_pass@1": 0.0, "recall@1": 0.0}


def test_intervals():
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson(0, 20)[0] == 0.0 and 0 < wilson(0, 20)[1] < 0.2
    a = np.array([0.0, 0.5, 1.0, 0.5] * 25)
    lo, hi = bootstrap_mean(a)
    assert lo < a.mean() < hi and hi - lo < 0.25
    s = summarize_metric("recall@32", a)
    assert s["ci"] == "bootstrap" and s["value"] == pytest.approx(0.5) and s["n"] == 100
    assert summarize_metric("pid_pass@1", [1, 0])["ci"] == "wilson"
    with pytest.raises(ValueError, match="no samples"):
        summarize_metric("pass@1", [])


def test_pid_map_both_key_forms_and_downsampled_popularity(tmp_path):
    items = [
        {"pid": 11, "count": 90, "count_after_downsample": 5},
        {"pid": 12, "count": 40, "count_after_downsample": 30},
        {"pid": 13, "count": 10, "count_after_downsample": 30},  # a tie: list order wins
    ]
    path = tmp_path / "sid2pid.json"
    path.write_text(json.dumps({str(pack((3, 2, 1))): items, "4,5,6": [{"iid": 7, "count": 1}]}))
    got = load_pid_map(path)
    assert pack((3, 2, 1)) == 3 * 8192**2 + 2 * 8192 + 1
    assert got == {(3, 2, 1): 12, (4, 5, 6): 7}
    path.write_text(json.dumps({"1": []}))
    with pytest.raises(ValueError, match="maps no SID"):
        load_pid_map(path)
    path.write_text(json.dumps({str(8192**3): items}))
    with pytest.raises(ValueError, match="exceeds"):
        load_pid_map(path)


def _parquet(path, rows):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def _row(answer, pids=None):
    meta = {"answer": answer} | ({"answer_pid": pids} if pids else {})
    return {"messages": [{"role": "user", "content": "hi"}], "metadata": json.dumps(meta)}


def test_dataset_reading_and_errors(tmp_path):
    f = tmp_path / "ad" / "ad_test.parquet"
    _parquet(f, [_row("<|sid_begin|><s_a_1><s_b_2><s_c_3><|sid_end|><s_a_7><s_b_8><s_c_9>", [5])])
    (file,) = load_dataset(tmp_path)
    s = file.samples[0]
    assert (file.task, s.task, s.truth, s.truth_pids) == ("ad", "ad", (A, C), (5,))
    assert s.messages == [{"role": "user", "content": "hi"}]
    assert not file.official and "the official ad test set has 30131" in file.official_why
    _parquet(f, [_row("no sid here")])
    with pytest.raises(ValueError, match="row 0: no ground-truth SID"):
        load_dataset(f)
    _parquet(f, [{"text": "x"}])
    with pytest.raises(ValueError, match="'messages' column"):
        load_dataset(f)
    empty = tmp_path / "e"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .parquet"):
        load_dataset(empty)
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "missing.parquet")
    j = tmp_path / "d.jsonl"
    j.write_text(
        json.dumps(
            {
                "messages": [{"role": "user", "content": "q"}],
                "answer": "<s_a_4><s_b_5><s_c_6>",
                "task": "video",
            }
        )
        + "\n"
    )
    (jf,) = load_dataset(j)
    assert jf.samples[0].truth == (B,) and jf.samples[0].task == "video"
    j.write_text("")
    with pytest.raises(ValueError, match="holds no samples"):
        load_dataset(j)


def test_official_detection(tmp_path):
    p = tmp_path / "benchmark_data" / "video" / "video_test.parquet"
    assert official_check(p, 38781) == (True, "official layout, task video, 38781 rows")
    for rows in (50, 38780, 38782):  # a cut, or another version of the set
        ok, why = official_check(p, rows)
        assert not ok and "the official video test set has 38781" in why
    inter = tmp_path / "benchmark_data" / "interactive" / "interactive_test.parquet"
    assert official_check(inter, OFFICIAL_SIZES["interactive"])[0]
    ok, why = official_check(tmp_path / "benchmark_data" / "foo" / "foo_test.parquet", 5000)
    assert not ok and "not one of" in why
    ok, why = official_check(tmp_path / "video_test.parquet", 38781)
    assert not ok and "is not {data dir}/{task}/{task}_test.parquet" in why
    # the benchmark's evaluation script reads data_v1.0/{task}/: any data dir counts
    assert official_check(tmp_path / "data_v1.0" / "video" / "video_test.parquet", 38781)[0]
    # a generated set (plant.json in its data dir) never passes, whatever its size
    gen = tmp_path / "gen"
    (gen / "interactive").mkdir(parents=True)
    (gen / "plant.json").write_text("{}")
    ok, why = official_check(gen / "interactive" / "interactive_test.parquet", 1000)
    assert not ok and "generated" in why


def test_official_flag_fixes_the_protocol(tmp_path, capsys):
    from harness.cli.eval import main

    f = tmp_path / "v" / "v_test.parquet"
    _parquet(f, [_row("<s_a_1><s_b_2><s_c_3>")])
    assert main([str(f), "--url", "http://127.0.0.1:9", "--official", "--beams", "8"]) == 2
    assert "--official fixes the protocol; drop --beams 8" in capsys.readouterr().err
    assert main([str(tmp_path / "nope.parquet"), "--url", "http://127.0.0.1:9"]) == 2
    # nothing listens: every request fails, which is a server error, not a zero score
    assert main([str(f), "--url", "http://127.0.0.1:9", "--timeout", "2"]) == 3
    assert "every one of 1 requests failed" in capsys.readouterr().err


def test_published_numbers_only_beside_an_official_set(tmp_path):
    from harness.quality.dataset import DatasetFile, Sample
    from harness.quality.evaluate import Answer, EvalOptions, render, score

    s = Sample("video", 0, [{"role": "user", "content": "x"}], (A,))
    answers = [Answer(s, ["<s_a_1><s_b_2><s_c_3>", "<s_a_1><s_b_2><s_c_3>", "junk"])]
    path = tmp_path / "benchmark_data" / "video" / "video_test.parquet"
    for official in (True, False):
        f = DatasetFile(path, "video", [s], official, "why not")
        got = score(answers, EvalOptions(), None, None, [f])
        block = got["tasks"]["video"]
        assert block["metrics"]["recall@32"]["value"] == 1.0
        assert (block["invalid_rate"]["count"], block["duplicate_rate"]["count"]) == (1, 1)
        text = render(got, official=True)
        if official:
            assert block["published"] == {"recall@32": {"OneRec-1.7B": 0.0272, "OneRec-8B": 0.0355}}
            assert "published: OneRec-1.7B 0.0272, OneRec-8B 0.0355" in text
        else:
            assert "published" not in block and "not shown" in text and "why not" in text


def test_progress_lines_go_to_stderr_as_it_is_when_printed(monkeypatch):
    """The default stream is looked up per line: a stderr replaced after import (and closed
    since, as a test's capture is) is never written to."""
    import io

    from harness.quality.evaluate import progress_printer

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    show = progress_printer(2)
    first.close()  # the stream in place when the printer was made is gone
    monkeypatch.setattr(sys, "stderr", second)
    show(2)  # the last sample: always printed
    assert "eval: 2/2 samples (100%)" in second.getvalue()
