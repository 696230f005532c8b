"""One module per kind of run: plan, measure (a runner), judge (kvdiag.verdicts), finish_run."""
