"""fencing(): context manager, decorator (sync and async), nesting, task and thread isolation."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from fencekit.context import current_token, fencing
from fencekit.errors import MalformedTokenError


def test_nesting_restores_outer_token() -> None:
    assert current_token() is None
    with fencing(33) as outer:
        assert outer == 33
        assert current_token() == 33
        with fencing(34):
            assert current_token() == 34
        assert current_token() == 33
    assert current_token() is None


def test_one_scope_entered_inside_itself_restores_in_order() -> None:
    scope = fencing(5)
    with scope:
        with fencing(6):
            with scope:
                assert current_token() == 5
                with scope:
                    assert current_token() == 5
                assert current_token() == 5
            assert current_token() == 6
        assert current_token() == 5
    assert current_token() is None


def test_exception_inside_scope_restores() -> None:
    with pytest.raises(RuntimeError), fencing(7):
        raise RuntimeError("boom")
    assert current_token() is None


def test_invalid_token_rejected_at_scope_creation() -> None:
    with pytest.raises(MalformedTokenError):
        fencing(True)  # type: ignore[arg-type]
    with pytest.raises(MalformedTokenError):
        fencing(0)


def test_decorator_sync_and_recursion() -> None:
    @fencing(5)
    def work(depth: int) -> list[int | None]:
        seen = [current_token()]
        if depth:
            seen += work(depth - 1)
        return seen

    assert work(3) == [5, 5, 5, 5]
    assert current_token() is None
    assert work.__name__ == "work"


async def test_decorator_async_concurrent_calls() -> None:
    @fencing(9)
    async def work() -> int | None:
        await asyncio.sleep(0.01)
        return current_token()

    assert await asyncio.gather(*(work() for _ in range(20))) == [9] * 20
    assert current_token() is None


def test_decorating_a_generator_is_refused() -> None:
    with pytest.raises(TypeError, match="generator"):

        @fencing(1)
        def gen():  # type: ignore[no-untyped-def]
            yield current_token()


async def test_tasks_do_not_see_each_others_tokens() -> None:
    async def worker(token: int) -> list[int | None]:
        seen = []
        async with fencing(token):
            for _ in range(5):
                await asyncio.sleep(0)
                seen.append(current_token())
        seen.append(current_token())
        return seen

    results = await asyncio.gather(*(worker(t) for t in range(1, 11)))
    for token, seen in zip(range(1, 11), results, strict=True):
        assert seen == [token] * 5 + [None]


def test_threads_see_token_only_when_context_is_copied() -> None:
    seen: dict[str, int | None] = {}
    with fencing(12):
        ctx = contextvars.copy_context()
        plain = threading.Thread(target=lambda: seen.__setitem__("plain", current_token()))
        copied = threading.Thread(
            target=lambda: ctx.run(lambda: seen.__setitem__("copied", current_token()))
        )
        for t in (plain, copied):
            t.start()
            t.join()
    assert seen == {"plain": None, "copied": 12}


async def test_to_thread_copies_context() -> None:
    with fencing(77):
        assert await asyncio.to_thread(current_token) == 77
