"""Judging: a run's gates and targets (:mod:`harness.judge.report`), two runs compared
(:mod:`harness.judge.runs`, quality metrics sample by sample in :mod:`harness.judge.samples`),
the paired comparison of an interleaved A/B run (:mod:`harness.judge.paired`) and the A/B
gate's outcome (:mod:`harness.judge.ab`)."""
