"""A user's own conversations as probe sessions (docs/own-sessions.md): session files read and
validated line by line (`formats`), planned into the same CasePlan the generated sessions
make (`plan`), scored on free text (`score`), and kept out of the run's files on request
(`privacy`)."""
