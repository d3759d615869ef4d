"""One error hierarchy: every exception class the packages define derives from ENSError and
lives in profiles/errors.py (other modules only re-export them)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

from profiles import errors
from profiles.errors import ENSError
from tests.helpers_service import ROOT

PACKAGES = ("profiles", "filters", "notifiers", "adapters", "ens")


def _modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        names.append(pkg)
        mod = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(mod.__path__, prefix=pkg + "."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every public exception class defined (not imported) in the packages, by its name."""
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.split(".")[0] in PACKAGES
                and not attr.startswith("_")
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_user_visible_error_derives_from_ens_error_in_one_module() -> None:
    classes = _exception_classes()
    # the ones the issue named, so the walk cannot pass by finding nothing
    for name in (
        "DatasetError",
        "LockLost",
        "BadEvent",
        "TsOutOfWindow",
        "ConfigError",
        "DemoError",
        "DemoFailure",
        "ProfileError",
        "EventError",
        "ManyErrors",
        "StoreMissing",
        "EmbeddedError",
    ):
        assert f"profiles.errors.{name}" in classes, name
    outside = sorted(n for n in classes if not n.startswith("profiles.errors."))
    assert outside == [], f"exception classes defined outside profiles/errors.py: {outside}"
    loose = sorted(n for n, c in classes.items() if not issubclass(c, ENSError))
    assert loose == [], f"not derived from ENSError: {loose}"


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("DatasetError", ValueError),
        ("BadEvent", ValueError),
        ("TsOutOfWindow", ValueError),
        ("LockLost", RuntimeError),
    ],
)
def test_errors_keep_their_builtin_base(name: str, base: type[Exception]) -> None:
    """`except ValueError` / `except RuntimeError` handlers written before still catch them."""
    assert issubclass(getattr(errors, name), base)


def test_old_import_paths_still_name_the_same_classes() -> None:
    from adapters.datasets import DatasetError
    from adapters.service.api import BadEvent, TsOutOfWindow
    from adapters.service.embedded import EmbeddedError
    from adapters.service.redis_store import StoreMissing
    from adapters.service.worker import LockLost
    from ens.demo import DemoError, DemoFailure
    from notifiers.config import ConfigError

    assert (
        DatasetError,
        BadEvent,
        TsOutOfWindow,
        LockLost,
        DemoError,
        DemoFailure,
        ConfigError,
        StoreMissing,
        EmbeddedError,
    ) == (
        errors.DatasetError,
        errors.BadEvent,
        errors.TsOutOfWindow,
        errors.LockLost,
        errors.DemoError,
        errors.DemoFailure,
        errors.ConfigError,
        errors.StoreMissing,
        errors.EmbeddedError,
    )


def test_exit_status_of_a_run_that_could_not_finish_is_1() -> None:
    """ens.cli.main ends a command with the error's exit_status, no traceback."""
    code = (
        "import ens.cli, sys\n"
        "from profiles.errors import DemoFailure\n"
        "def boom(): raise DemoFailure('the service died')\n"
        "ens.cli.app = boom\n"
        "ens.cli.main()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip() == "error: the service died"
