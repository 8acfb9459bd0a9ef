"""What runs first in a worker process the kit starts from a callable.

``run_callable`` is the target of a ``multiprocessing`` spawn: it sends the worker's output to
its log file, connects the checkpoint channel, calls the user's function (running it with
``asyncio.run`` when it is a coroutine function) and reports how it ended. ``python -m
fencekit.testing._bootstrap module:function [JSON args]`` does the same from a command line (the
many-workers run starts its copies that way, under the chaos nemesis), calling the function
again and again until ``FENCEKIT_TESTING_UNTIL`` (epoch seconds) when that is set, at least once.

Before the user's code is imported, the worker runs its framework's setup: a Django project's
worker (``DJANGO_SETTINGS_MODULE`` in its environment) gets ``fencekit.django.testing:
setup_worker``, which points ``DATABASES['default']`` at the test's database (the DSN in
``FENCEKIT_TEST_APP_DSN``) and calls ``django.setup()``. ``FENCEKIT_TESTING_SETUP`` names
another ``module:function`` to run instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from fencekit.testing import channel as _cp

UNTIL_ENV = "FENCEKIT_TESTING_UNTIL"
SETUP_ENV = "FENCEKIT_TESTING_SETUP"
APP_DSN_ENV = "FENCEKIT_TEST_APP_DSN"
# Named, not imported: the kit does not depend on the Django integration.
_DJANGO_SETUP = "fencekit.django.testing:setup_worker"


def setup_framework() -> None:
    """Run the worker's framework setup (see the module docstring), before its code is
    imported: a Django model cannot be imported before ``django.setup()``."""
    target = os.environ.get(SETUP_ENV) or (
        _DJANGO_SETUP if os.environ.get("DJANGO_SETTINGS_MODULE") else ""
    )
    if target:
        resolve(target)()


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(*args, **kwargs))
    result = fn(*args, **kwargs)
    if inspect.iscoroutine(result):
        return asyncio.run(result)
    return result


def describe_error(exc: BaseException) -> dict[str, Any]:
    """An exception as JSON: type, message, and a fence rejection's reason, token and fence."""
    out: dict[str, Any] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    from fencekit.errors import FenceError

    if isinstance(exc, FenceError):
        out.update(
            reason=exc.reason, sqlstate=exc.sqlstate, token=exc.token, fence=exc.fence,
            table=exc.table,
        )  # fmt: skip
    return out


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    _cp._connect()  # before the user's code: rejections it meets are forwarded from the start
    try:
        value = _call(fn, args, kwargs)
    except SystemExit as exc:  # the worker chose its exit code
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        _cp.report("outcome", ok=code == 0, value=None, error=None if code == 0 else {
            "type": "SystemExit", "message": f"exit code {code}", "traceback": ""})  # fmt: skip
        return code
    except BaseException as exc:
        _cp.report("outcome", ok=False, error=describe_error(exc))
        traceback.print_exc()
        return 1
    _cp.report("outcome", ok=True, value=_jsonable(value))
    return 0


def run_callable(call: bytes, env: dict[str, str], log: str) -> None:
    """Target of the worker's spawned process; ``call`` is the pickled ``(fn, args, kwargs)``,
    loaded once the environment and the framework are set up."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        setup_framework()
        fn, args, kwargs = pickle.loads(call)  # noqa: S301 - the test's own process pickled it
    except BaseException as exc:
        _cp._connect()
        _cp.report("outcome", ok=False, error=describe_error(exc))
        traceback.print_exc()
        sys.exit(1)
    code = _run(fn, args, kwargs)
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.exit, not os._exit: the atexit hook sends the worker's metric totals.
    sys.exit(code)


def resolve_attr(target: str) -> Any:
    """``module:attribute`` (dots allowed after the colon) to the object."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"expected module:attribute, not {target!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(target: str) -> Callable[..., Any]:
    """``module:function`` to the function."""
    obj = resolve_attr(target)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj  # type: ignore[no-any-return]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--name"]:
        # Named by the many-worker run: its connections say who they are (application_name),
        # which the write history records.
        name, argv = argv[1], argv[2:]
        os.environ["PGAPPNAME"] = f"fencekit-worker:{name}"
        os.environ[_cp.WORKER_ENV] = name
    setup_framework()
    fn = resolve(argv[0])
    spec = json.loads(argv[1]) if len(argv) > 1 else {}
    args, kwargs = tuple(spec.get("args", ())), dict(spec.get("kwargs", {}))
    until = os.environ.get(UNTIL_ENV)
    if not until:
        return _run(fn, args, kwargs)
    # Many copies under the nemesis: one job after another until the run's end, and at least
    # one: a replacement started late still takes a paused worker's lease over. A job that
    # fails (a rejection, a lost lease) is what the run is about: note it and go on.
    deadline = float(until)
    _cp._connect()
    code = 0
    first = True
    while first or time.time() < deadline:
        first = False
        try:
            _call(fn, args, kwargs)
        except (TypeError, AttributeError, NameError, ImportError):
            traceback.print_exc()  # a bug in how the worker is called, not a fault: stop
            return 1
        except Exception as exc:
            print(f"job failed: {type(exc).__name__}: {exc}", flush=True)
            with contextlib.suppress(Exception):
                time.sleep(0.01)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
