"""``python -m ens ...``: the same CLI as the ``ens`` script."""

from ens.cli import main

main()
