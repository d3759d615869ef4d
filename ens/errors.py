"""The errors of the commands themselves (`ens demo`): under `profiles.errors.ENSError`, like
every user-visible error; `ens.cli.main` ends a command with their `exit_status`."""

from __future__ import annotations

from profiles.errors import ENSError


class DemoError(ENSError):
    """A user error in `ens demo` (bad file, busy port): one line, exit status 2."""


class DemoFailure(ENSError):
    """The demo could not finish (the service died, a timeout): exit status 1."""

    exit_status = 1
