"""Every verdict kvdiag gives, decided here and nowhere else: one Verdict type, and one judge
per kind of run. Runners measure and return facts; commands call the judge of their kind;
every consumer (exit code, console, JSON, report badge, history, JUnit, Prometheus, fleet
page) reads the Verdict it returns. A test checks that no other module assigns one.

    verdict       exit  means
    pass          0     kvdiag looked where the bug lives (the trigger was reached, the ground
                        truth was sound) and found no corruption
    fail          1     corruption, a leak or a regression was found (or a positive control
                        that must catch its fault did not)
    inconclusive  2     the run was made but proves nothing: the trigger was not reached
                        (nothing recycled) or not reproduced (a faulty allocator showed nothing)
    error         2     the run's own ground truth is unsound (isolated requests hit the cache),
                        so nothing it measured can be judged

The judges, by kind of run (each returns a Judgement: the verdict and one sentence why):

    judge_reference   reproduce: clean series flat, faulty series caught, trigger reached
    judge_gate        verify --expect-guard / --expect-bug on one allocator
    judge_series      one series under test (regress on the reference engine)
    judge_probe       a live server: corruption, over-hits, recycling observed, ground truth
                      proved (every isolated request reported 0 cached tokens) and stable
    judge_audit       vLLM's allocator replayed: foreign reads, invariants, recycling
    judge_isolation   the tenant-isolation audit: judged configurations vs the control
    judge_regress     a run against its baseline, never better than its own ground truth
    judge_fleet       every cell of a fleet
    judge_compare     targets on the same sessions (kvdiag compare): the worst of theirs
    judge_matrix      the detection matrix: healthy passes, every planted fault is caught
    judge_sentinel    a sentinel's file on its own: any bad read fails, nothing checked proves nothing

One module per kind of evidence: core.py (Verdict, Judgement), reference.py (in-process
runs), live.py (a live probe: the classifications of divergences, over-hits and prompt
logprobs, and judge_probe), audits.py (the vLLM replay), isolation.py (tenant isolation),
runs.py (runs of runs: regress, fleet, the detection matrix), sentinel.py (a sentinel inside
the engine).
"""


from kvdiag.verdicts.audits import judge_audit
from kvdiag.verdicts.core import Judgement, Verdict, judge_unmeasured
from kvdiag.verdicts.isolation import ISOLATION_JUDGED, classify_leaks, judge_isolation
from kvdiag.verdicts.live import (
    CACHED_TOKEN_FLAGS,
    ProbeDetails,
    ProbeEvidence,
    classify_divergence,
    differential_over_hits,
    judge_probe,
    logprob_departed,
    over_hit,
    prompt_logprob_departures,
)
from kvdiag.verdicts.reference import judge_gate, judge_reference, judge_series
from kvdiag.verdicts.runs import (
    caught_as_expected,
    expected_detection,
    judge_compare,
    judge_fleet,
    judge_matrix,
    judge_regress,
    judge_unreached,
)
from kvdiag.verdicts.sentinel import judge_sentinel

__all__ = ["CACHED_TOKEN_FLAGS", "ISOLATION_JUDGED", "Judgement", "ProbeDetails", "ProbeEvidence", "Verdict",
           "caught_as_expected", "classify_divergence", "classify_leaks", "expected_detection", "judge_audit",
           "judge_compare", "judge_fleet", "judge_gate", "judge_isolation", "judge_matrix", "judge_probe", "judge_unreached",
           "judge_reference", "judge_regress", "judge_sentinel", "judge_series", "judge_unmeasured",
           "differential_over_hits", "logprob_departed", "over_hit", "prompt_logprob_departures"]
