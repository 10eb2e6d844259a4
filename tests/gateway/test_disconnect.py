"""A lost connection cancels its request's answer in the request's own task (gateway/server.py's
``Disconnect``, gateway/asgi.py's ``_answer_until_lost``): no second task per request waits for
``http.disconnect``. Through uvicorn, the e2e tests of a client that leaves
(tests/e2e/test_ledger_and_disconnect.py, tests/e2e/test_broker.py) fail without it; these say
what the answering task is left with."""

from __future__ import annotations

import asyncio
from contextlib import suppress

import pytest

from gateway.asgi import _answer_until_lost
from gateway.server import Disconnect


def test_an_answer_whose_client_is_already_gone_never_starts():
    started = []

    async def answer() -> str:
        started.append(True)
        return "answered"

    async def go() -> object:
        disconnect = Disconnect()
        disconnect.lose()
        return await _answer_until_lost(answer(), disconnect)

    assert asyncio.run(go()) is None
    assert started == []


def test_a_lost_connection_cancels_the_answer_and_leaves_the_task_uncancelled():
    seen: dict[str, object] = {}

    async def answer() -> str:
        try:
            await asyncio.Event().wait()  # the upstream call
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return "answered"

    async def go() -> None:
        disconnect = Disconnect()
        asyncio.get_running_loop().call_later(0.01, disconnect.lose)
        seen["result"] = await _answer_until_lost(answer(), disconnect)
        task = asyncio.current_task()
        assert task is not None
        seen["cancelling"] = task.cancelling()
        await asyncio.sleep(0)  # and the task goes on, not cancelled at its next wait
        seen["went on"] = True

    asyncio.run(go())
    assert seen == {"cancelled": True, "result": None, "cancelling": 0, "went on": True}


def test_an_answer_that_takes_the_cancel_in_keeps_its_result_and_the_task_uncancelled():
    """A stream cut while a chunk is being sent: the handler swallows the cancel, closes the
    stream and settles it, awaiting Redis on the same task."""

    async def answer() -> str:
        with suppress(asyncio.CancelledError):  # as process_request
            await asyncio.Event().wait()  # the send of a chunk the client no longer reads
        return "the response"

    async def go() -> tuple[object, int]:
        disconnect = Disconnect()
        asyncio.get_running_loop().call_later(0.01, disconnect.lose)
        result = await _answer_until_lost(answer(), disconnect)
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    assert asyncio.run(go()) == ("the response", 0)


def test_a_cancel_that_is_not_the_clients_goes_on_up():
    async def answer() -> str:
        await asyncio.Event().wait()
        return "answered"

    async def go() -> None:
        task = asyncio.create_task(_answer_until_lost(answer(), Disconnect()))
        await asyncio.sleep(0.01)
        task.cancel()  # the server shutting down
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(go())


def test_a_connection_lost_after_the_answer_cancels_nothing():
    async def answer() -> str:
        return "answered"

    async def go() -> tuple[object, int]:
        disconnect = Disconnect()
        result = await _answer_until_lost(answer(), disconnect)
        disconnect.lose()  # the client hangs up after its answer
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    assert asyncio.run(go()) == ("answered", 0)
