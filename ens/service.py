"""``python -m ens.service serve ...``: the service commands without the main CLI."""

from __future__ import annotations

import typer

from ens.commands.service import register
from ens.options import tidy_help_metavars

tidy_help_metavars()

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
register(app)

if __name__ == "__main__":
    app()
