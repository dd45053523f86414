"""ScriptedClient: a PolicyClient that returns canned texts per agent, for model-free workflow tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from marl.types import Completion, Message

Reply = str | Sequence[str] | Callable[[list[Message]], str]


@dataclass
class Call:
    role: str
    agent: str
    messages: list[Message]


class ScriptedClient:
    """Replies per agent: a fixed string, a list consumed one per call, or a function of the messages.

    `barrier` names agents that must all have started before any of them returns, which proves they
    were issued concurrently (a sequential caller would time out instead of hanging).
    """

    def __init__(self, replies: Mapping[str, Reply], barrier: Sequence[str] = ()) -> None:
        self.replies = dict(replies)
        self.calls: list[Call] = []
        self._used: dict[str, int] = {}
        self._barrier = set(barrier)
        self._arrived: set[str] = set()
        self._all_arrived: asyncio.Event | None = None

    async def complete(self, role: str, agent: str, messages: list[Message]) -> Completion:
        self.calls.append(Call(role, agent, messages))
        if agent in self._barrier:
            await self._wait_for_barrier(agent)
        text = self._text(agent, messages)
        return Completion(
            text=text,
            prompt_ids=list(range(sum(len(m["content"]) for m in messages) % 50 + 1)),
            response_ids=[ord(c) % 256 for c in text],
            logprobs=[-0.5] * len(text),
        )

    async def _wait_for_barrier(self, agent: str) -> None:
        if self._all_arrived is None:
            self._all_arrived = asyncio.Event()
        self._arrived.add(agent)
        if self._arrived == self._barrier:
            self._all_arrived.set()
        await asyncio.wait_for(self._all_arrived.wait(), timeout=2.0)

    def _text(self, agent: str, messages: list[Message]) -> str:
        reply = self.replies[agent]
        if callable(reply):
            return reply(messages)
        if isinstance(reply, str):
            return reply
        i = self._used.get(agent, 0)
        self._used[agent] = i + 1
        return reply[min(i, len(reply) - 1)]

    def agents(self) -> list[str]:
        return [c.agent for c in self.calls]
