"""The run record: what a finished run leaves behind and how it is read back. `rundir` (the
reports/<run-id>/ directory, atomic writes, `load_summary`), `summary`, `summary_rows`,
`evidence`, `isolation_rows` and `audit_section` (summary.json, typed), `results` (the
signature and RunResult), `cmdline` (the rerun command) and `environment` (the machine and
versions a run ran on). The lifecycle that writes a record
is kvdiag.commands.lifecycle: it also writes the report, and the report reads the record."""
