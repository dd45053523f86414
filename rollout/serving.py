"""An engine's serving loop: calls arrive from any thread or event loop and are served on one thread the
engine owns, so many can be in flight at once (continuous batching in vLLM, small dynamic batches in the HF
stand-in) while the engine still answers `progress` and weight loads.

A backend supplies a `Stepper`: `admit(jobs)` takes new calls, `step(count)` does one unit of work (one vLLM
engine step; one HF batch) and resolves the calls it finished, reporting each token it generates through
`count`, and `busy()` says whether an admitted call is unfinished. The loop's token counter is what an
EngineGroup watches to tell a slow engine (counter moving) from a hung one (counter flat).

Weight loads run under `paused()`: new calls wait in the queue, the loop finishes every admitted call, and
only then does the load start, so no request is ever served by two weight versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from marl.types import Completion, Message
from rollout.engine import Sampling

P = ParamSpec("P")
R = TypeVar("R")
E = TypeVar("E", bound="ChatServing")  # an engine: what `between_calls` pauses is its `loop`
_IDLE_WAKE_S = 1.0  # an idle loop rechecks this often whether its engine is gone (then its thread ends)


@dataclass(eq=False)
class Job:
    """One engine call: its prompts (token ids), their sampling (request i is
    seeded `sampling.request_seed(i)`), the adapter to serve them through, and
    where their completions go, in order."""

    prompts: list[list[int]]
    sampling: Sampling
    adapter: str | None
    future: Future[list[Completion]] = field(default_factory=Future)


class Stepper(Protocol):
    def admit(self, jobs: list[Job]) -> None: ...

    def step(self, count: Callable[[int], None]) -> None: ...

    def busy(self) -> bool: ...

    def fail(self, error: BaseException) -> None:
        """Fail every admitted call with `error` (the step raised) and forget them."""
        ...


class ChatServing:
    """The chat front both engines share: messages -> token ids through the model's chat
    template, then a `Job` on the engine's serving loop. An engine sets `tokenizer`,
    `chat_kwargs` (extra chat-template arguments, e.g.
    thinking off) and `loop` in its constructor."""

    tokenizer: Any
    chat_kwargs: dict[str, Any]
    loop: ServingLoop

    def encode(self, messages: list[Message]) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **self.chat_kwargs
        )
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def generate(self, requests: list[list[Message]], sampling: Sampling,
                 adapter: str | None = None) -> list[Completion]:
        """`adapter`: serve through that policy's LoRA adapter (the base model until one was loaded). Request
        i is seeded `sampling.request_seed(i)`; the call's requests enter the engine together."""
        return self.loop.submit(Job([self.encode(m) for m in requests], sampling, adapter)).result()

    async def generate_async(self, requests: list[list[Message]], sampling: Sampling,
                             adapter: str | None = None) -> list[Completion]:
        job = Job([self.encode(m) for m in requests], sampling, adapter)
        return await asyncio.wrap_future(self.loop.submit(job))

    async def progress(self) -> int:
        return self.loop.tokens


class ServingLoop:
    """Serves `Job`s through `stepper` on its own thread; `tokens` counts every token generated so far."""

    def __init__(self, stepper: Stepper, name: str):
        self.stepper, self.tokens = stepper, 0
        self._cond = threading.Condition()
        self._queue: list[Job] = []
        self._paused = 0
        self._active = False  # the stepper holds unfinished calls (or is admitting some)
        # The thread holds the loop weakly: an engine that is dropped (an in-process group shut down) is freed
        # and its thread ends, instead of the thread keeping the model alive.
        threading.Thread(target=_serve, args=(weakref.ref(self),), name=f"serve:{name}", daemon=True).start()

    def submit(self, job: Job) -> Future[list[Completion]]:
        with self._cond:
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    def _count(self, n: int) -> None:
        # only the loop's thread writes; readers see some recent value, which is all they need
        self.tokens += n

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Holds new calls back and waits for the admitted ones to finish (weight loads run inside)."""
        with self._cond:
            self._paused += 1
            self._cond.wait_for(lambda: not self._active)
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def _iterate(self) -> None:
        """One pass of the thread: admit what may be admitted, step once (or wait a while when idle)."""
        with self._cond:
            if not self._active and not (self._queue and not self._paused):
                self._cond.wait(_IDLE_WAKE_S)
                return
            new, self._queue = ([], self._queue) if self._paused else (self._queue, [])
            self._active = True
        try:
            if new:
                self.stepper.admit(new)
            self.stepper.step(self._count)
        except BaseException as e:  # noqa: BLE001 - every waiting call must see the engine's failure
            for job in new:
                if not job.future.done():
                    job.future.set_exception(e)
            self.stepper.fail(e)
        with self._cond:
            self._active = self.stepper.busy()
            self._cond.notify_all()


def _serve(ref: weakref.ref[ServingLoop]) -> None:
    while (loop := ref()) is not None:
        loop._iterate()
        del loop


def between_calls(method: Callable[Concatenate[E, P], R]) -> Callable[Concatenate[E, P], R]:
    """An engine method (a weight load) run with the engine's serving loop (`self.loop`) paused: after every
    call already admitted has finished and before any later one starts."""

    @functools.wraps(method)
    def run(self: E, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.loop.paused():
            return method(self, *args, **kwargs)

    return run
