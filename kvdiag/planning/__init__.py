"""Planning: what a run will send, decided before anything is sent. `suites` reads and checks
a suite file, `scenarios` holds the trigger schedules and their ablations, `plan` turns a
suite case into sessions and their prompt token ids, and `sessions` does the same for a
user's sessions file. Layered: suites and sessions use scenarios; plan uses all three."""
