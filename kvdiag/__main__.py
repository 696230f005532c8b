"""`python -m kvdiag`: the same CLI as the `kvdiag` command."""

from kvdiag.cli import main

main()
