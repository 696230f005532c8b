"""kvdiag's own errors: each message is one line naming the file, key or target at fault."""


class KvdiagError(Exception):
    """Bad input to kvdiag (suite, target, run directory...): exit code 2."""


class SuiteError(KvdiagError):
    """A suite file is malformed; the message names the file and the key."""


class EndpointError(KvdiagError):
    """The endpoint under test cannot be reached or answers in a way kvdiag cannot use."""
