"""Role → policy routing. Shared and Isolated differ only here; nothing downstream branches on it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

SHARED_POLICY_ID = "shared"


class Sharing(StrEnum):
    """`marl.sharing`: the maps PolicyMap.build makes (the config schema's type for the key)."""

    shared = "shared"
    isolated = "isolated"
    custom = "custom"


@dataclass(frozen=True)
class PolicyMap:
    """An immutable role → policy_id mapping."""

    mapping: tuple[tuple[str, str], ...]

    @classmethod
    def shared(cls, roles: Iterable[str], policy_id: str = SHARED_POLICY_ID) -> PolicyMap:
        return cls(tuple((r, policy_id) for r in roles))

    @classmethod
    def isolated(cls, roles: Iterable[str]) -> PolicyMap:
        return cls(tuple((r, r) for r in roles))

    @classmethod
    def custom(cls, roles: Iterable[str], mapping: Mapping[str, str]) -> PolicyMap:
        roles = list(roles)
        missing = [r for r in roles if r not in mapping]
        extra = [r for r in mapping if r not in roles]
        if missing or extra:
            raise ValueError(
                f"marl.policy_map must name exactly the workflow's roles {roles}: "
                f"missing {missing}, unknown {extra}"
            )
        return cls(tuple((r, mapping[r]) for r in roles))

    @classmethod
    def build(cls, sharing: str, roles: Iterable[str], custom: Mapping[str, str] | None = None) -> PolicyMap:
        if sharing == "shared":
            return cls.shared(roles)
        if sharing == "isolated":
            return cls.isolated(roles)
        if sharing == "custom":
            return cls.custom(roles, custom or {})
        raise ValueError(f"marl.sharing must be shared, isolated or custom, got {sharing!r}")

    def __getitem__(self, role: str) -> str:
        for r, p in self.mapping:
            if r == role:
                return p
        raise KeyError(f"role {role!r} is not in the policy map {dict(self.mapping)}")

    @property
    def roles(self) -> list[str]:
        return [r for r, _ in self.mapping]

    @property
    def policies(self) -> list[str]:
        """Policy ids in first-appearance order (stable across runs)."""
        return list(dict.fromkeys(p for _, p in self.mapping))

    def roles_of(self, policy_id: str) -> list[str]:
        return [r for r, p in self.mapping if p == policy_id]
