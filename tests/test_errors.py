"""One error hierarchy: every exception class the packages define derives from ENSError
(profiles/errors.py, the lowest layer) and lives in the `errors` module of the layer that
raises it (the lowest layer whose code names it); the old import paths still name them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys

import pytest

from adapters import errors as adapter_errors
from profiles.errors import ENSError
from tests.helpers_service import ROOT

# lowest first: a package imports only the ones before it (the import-linter layers)
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


def test_every_user_visible_error_derives_from_ens_error_in_an_errors_module() -> None:
    classes = _exception_classes()
    # the ones the issue named, so the walk cannot pass by finding nothing
    for name in (
        "adapters.errors.DatasetError",
        "adapters.errors.LockLost",
        "adapters.errors.BadEvent",
        "adapters.errors.TsOutOfWindow",
        "adapters.errors.StoreMissing",
        "adapters.errors.EmbeddedError",
        "notifiers.errors.ConfigError",
        "ens.errors.DemoError",
        "ens.errors.DemoFailure",
        "profiles.errors.ProfileError",
        "profiles.errors.EventError",
        "profiles.errors.ManyErrors",
    ):
        assert name in classes, name
    outside = sorted(n for n in classes if n.rsplit(".", 2)[-2] != "errors")
    assert outside == [], f"exception classes defined outside an errors module: {outside}"
    loose = sorted(n for n, c in classes.items() if not issubclass(c, ENSError))
    assert loose == [], f"not derived from ENSError: {loose}"


def test_each_error_lives_in_the_layer_that_raises_it() -> None:
    """The lowest layer whose code (its errors modules aside) names the class is its own: not
    lower (an upper layer's error in the bottom one), not higher (a lower layer could not
    raise it)."""
    sources = {
        pkg: " ".join(p.read_text() for p in (ROOT / pkg).rglob("*.py") if p.name != "errors.py")
        for pkg in PACKAGES
    }
    wrong = []
    for name, cls in _exception_classes().items():
        if cls is ENSError:
            continue
        word = re.compile(rf"\b{cls.__name__}\b")
        users = [pkg for pkg in PACKAGES if word.search(sources[pkg])]
        layer = name.split(".")[0]
        if users and users[0] != layer:
            wrong.append(f"{name}: first named in {users[0]}")
    assert wrong == [], wrong


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
    assert issubclass(getattr(adapter_errors, name), base)


def test_old_import_paths_still_name_the_same_classes() -> None:
    from adapters.datasets import DatasetError
    from adapters.service.api import BadEvent, TsOutOfWindow
    from adapters.service.embedded import EmbeddedError
    from adapters.service.redis_store import StoreMissing
    from adapters.service.worker import LockLost
    from ens.demo import DemoError, DemoFailure
    from ens.errors import DemoError as DemoErrorNow
    from ens.errors import DemoFailure as DemoFailureNow
    from notifiers.config import ConfigError
    from notifiers.errors import ConfigError as ConfigErrorNow

    assert (
        DatasetError,
        BadEvent,
        TsOutOfWindow,
        LockLost,
        StoreMissing,
        EmbeddedError,
        DemoError,
        DemoFailure,
        ConfigError,
    ) == (
        adapter_errors.DatasetError,
        adapter_errors.BadEvent,
        adapter_errors.TsOutOfWindow,
        adapter_errors.LockLost,
        adapter_errors.StoreMissing,
        adapter_errors.EmbeddedError,
        DemoErrorNow,
        DemoFailureNow,
        ConfigErrorNow,
    )


def test_exit_status_of_a_run_that_could_not_finish_is_1() -> None:
    """ens.cli.main ends a command with the error's exit_status, no traceback."""
    code = (
        "import ens.cli, sys\n"
        "from ens.errors import DemoFailure\n"
        "def boom(): raise DemoFailure('the service died')\n"
        "ens.cli.app = boom\n"
        "ens.cli.main()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip() == "error: the service died"
