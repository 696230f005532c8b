from kvdiag.cli import main

main()
