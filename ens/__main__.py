"""`python -m ens`: the same CLI as the `ens` script (handy in a checkout without the script on PATH)."""

from ens.cli import main

main()
