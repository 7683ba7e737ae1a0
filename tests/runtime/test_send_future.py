"""SendFuture behaves as a concurrent.futures.Future for every way of using one."""

import asyncio
import threading
from concurrent.futures import InvalidStateError, wait

import pytest

from sparkcoord.runtime.futures import SendFuture


def test_a_completed_future_nobody_waited_on_reports_its_result() -> None:
    f = SendFuture()
    assert not f.done()
    f.set_result(7)
    assert f.done() and f.result(timeout=0) == 7 and f.exception(timeout=0) is None
    with pytest.raises(InvalidStateError):
        f.set_result(8)


def test_reading_a_finished_future_creates_no_condition() -> None:
    # the channel reads every request's answer future once it finished: no condition for it
    f = SendFuture()
    f.set_result(7)
    called = []
    f.add_done_callback(lambda done: called.append(done.result()))
    assert f.result() == 7 and f.exception() is None and called == [7]
    failed = SendFuture()
    failed.set_exception(KeyError("k"))
    assert isinstance(failed.exception(), KeyError)
    with pytest.raises(KeyError):
        failed.result()
    assert "_condition" not in f.__dict__ and "_condition" not in failed.__dict__


def test_a_callback_added_to_a_finished_future_that_raises_is_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    f = SendFuture()
    f.set_result(1)
    f.add_done_callback(lambda done: 1 / 0)  # as concurrent.futures does: logged
    assert "exception calling callback" in caplog.text


def test_a_failed_future_raises_its_exception() -> None:
    f = SendFuture()
    f.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        f.result(timeout=0)
    with pytest.raises(InvalidStateError):
        f.set_exception(KeyError("again"))


def test_a_waiter_in_another_thread_is_woken_by_the_completion() -> None:
    f = SendFuture()
    got = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        got.append(f.result(timeout=30))

    t = threading.Thread(target=waiter)
    t.start()
    started.wait(10)
    f.set_result("done")
    t.join(30)
    assert got == ["done"]


def test_callbacks_and_concurrent_futures_wait_work() -> None:
    f = SendFuture()
    seen = []
    f.add_done_callback(lambda fut: seen.append(fut.result()))
    f.set_result(1)
    assert seen == [1]
    g = SendFuture()
    g.set_result(2)
    done, not_done = wait([f, g], timeout=0)
    assert done == {f, g} and not not_done


def test_asyncio_can_await_it() -> None:
    async def go() -> object:
        f = SendFuture()
        asyncio.get_running_loop().call_soon(f.set_result, "async")
        return await asyncio.wrap_future(f)

    assert asyncio.run(go()) == "async"


def test_a_timeout_on_an_unfinished_future_is_a_timeout() -> None:
    from concurrent.futures import TimeoutError as FutureTimeout
    with pytest.raises(FutureTimeout):
        SendFuture().result(timeout=0)
