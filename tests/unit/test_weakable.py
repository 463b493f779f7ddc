"""Weak references to compiled objects go through an anchor (appbridge/weakable.py): mypyc's
deallocators do not clear weak references, so none may point at a compiled object."""

from __future__ import annotations

import gc

from appbridge import compiled
from appbridge.weakable import Anchor, WeakTo


class Owner:
    def __init__(self) -> None:
        self.anchor: Anchor[Owner] = Anchor(self)


def test_a_weak_reference_through_the_anchor_sees_the_owner_until_it_lets_go() -> None:
    owner = Owner()
    ref = WeakTo(owner.anchor)
    assert ref() is owner
    owner.anchor.target = None  # the owner lets go of its parts
    assert ref() is None


def test_it_is_none_once_the_owner_is_collected() -> None:
    owner = Owner()
    ref = WeakTo(owner.anchor)
    del owner
    gc.collect()
    assert ref() is None


def test_the_compiled_call_takes_no_weak_reference_itself() -> None:
    """The call is what other parts hold weakly: through its anchor only. Compiled, its class
    has no weak-reference slot at all, so no weak reference to it can dangle."""
    from appbridge.calls.call import Call

    # Interpreted (a tree without a build) the class is a plain one, whose weakrefs clear.
    expected = 0 if compiled.is_compiled("appbridge.calls.call") else Call.__weakrefoffset__
    assert Call.__weakrefoffset__ == expected
