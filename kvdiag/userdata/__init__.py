"""A user's own conversations as probe sessions (docs/own-sessions.md): session files read and
validated line by line (`formats`), missing answers asked of the server first (`history`),
planned into the same CasePlan as generated sessions (kvdiag.planning.sessions), scored on
free text (`score`), and kept out of the run's files on request (`privacy`)."""
