"""``flashrec-bench eval`` against a server that is not there stops after the first few
requests that could not connect, naming the URL, instead of sending every sample first."""

from __future__ import annotations

import json
import re

from harness.cli.eval import main
from harness.servers.launch import free_port

SAMPLES = 40


def _dataset(tmp_path):
    path = tmp_path / "d.jsonl"
    row = {"messages": [{"role": "user", "content": "q"}], "answer": "<s_a_4><s_b_5><s_c_6>"}
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(SAMPLES)))
    return path


def test_eval_against_a_closed_port_stops_early_and_names_the_url(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code = main([str(_dataset(tmp_path)), "--url", url, "--concurrency", "2", "--timeout", "10"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert f"cannot connect to {url}: " in err, err
    assert "consecutive requests failed to connect" in err
    stopped = re.search(r"stopped after (\d+) of (\d+) samples", err)
    assert stopped is not None, err
    sent, total = map(int, stopped.groups())
    assert total == SAMPLES and 3 <= sent <= 8, err
    assert f"{SAMPLES}/{SAMPLES} samples" not in err, "every sample was sent first"
