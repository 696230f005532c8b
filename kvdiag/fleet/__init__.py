"""The weekly job across a fleet: every (target, suite, case) of a FLEET.yaml is one Ray task
that measures; the driver alone records (run directories, history, baselines).

    spec.py     FLEET.yaml -> validated Fleet (every error before Ray starts)
    cell.py     what one Ray task runs: the measurement of one cell, returned as data
    driver.py   the Ray driver: submit, time limits, retries, record, resume
    page.py     the fleet's HTML page: targets x (suite, case), trend per target
    run.py      `kvdiag fleet run` start to finish, and its FleetResult

The fleet sits above the command layer: each cell is a regress run (kvdiag.commands).
"""
