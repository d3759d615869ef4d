"""`python -m ens`: the same command line as the `ens` script."""

from ens.cli import main

main()
