"""Weak references to compiled objects, through an interpreted anchor.

mypyc (appbridge/compiled.py) gives a native class that derives from an interpreted one a
weak-reference slot, but the deallocator it generates never clears the weak references to the
dying object, as CPython's own does: a weak reference that outlives the object then points at
freed memory, and the collector crashes on it. So a compiled object is never weakly referenced
itself. It owns an :class:`Anchor`, a plain object pointing back at it, and others hold weak
references to the anchor, which clear as they should. The owner drops ``anchor.target`` when it
lets go of its parts (calls/call.py), so the two form no reference cycle past that point.
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

T = TypeVar("T")


class Anchor(Generic[T]):
    """Stands for one compiled object wherever a weak reference to it is wanted."""

    __slots__ = ("__weakref__", "target")

    def __init__(self, target: T) -> None:
        self.target: T | None = target


class WeakTo(Generic[T]):
    """A weak reference to an anchor's object: the object, or None once it is let go."""

    __slots__ = ("_anchor",)

    def __init__(self, anchor: Anchor[T]) -> None:
        self._anchor = weakref.ref(anchor)

    def __call__(self) -> T | None:
        anchor = self._anchor()
        return None if anchor is None else anchor.target
