"""A member method named by the method itself (`Member.method`), never by a string, with its arguments checked
against its signature. No Ray here: the modules that define what members implement import it too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

M_contra = TypeVar("M_contra", contravariant=True)  # the member class (or a Protocol it satisfies)
R = TypeVar("R")
P = ParamSpec("P")


def method_name(method: Callable[..., Any]) -> str:
    """The remote name of a member method given as `Member.method`."""
    name = getattr(method, "__name__", None)
    if not isinstance(name, str) or name.startswith("<"):
        raise TypeError(f"a member method is given as the unbound method (Member.method); got {method!r}")
    return name


class Call(Generic[M_contra, R]):
    """One member method with its arguments, checked against the method's signature: what `Group.submit_each`
    hands each member."""

    def __init__(self, method: Callable[Concatenate[M_contra, P], R], /, *args: P.args, **kwargs: P.kwargs):
        self.method: str = method_name(method)
        self.args: tuple[Any, ...] = args
        self.kwargs: dict[str, Any] = kwargs
