"""Live calls by callRef, plus a bounded memory of recently ended ones (GET /v1/calls/{callRef})."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from appbridge.console.board import CallConsole

if TYPE_CHECKING:
    from appbridge.calls.call import Call


class RegistryObserver(Protocol):
    """Told synchronously of every call that opens or ends (the cluster directory,
    appbridge/cluster/service.py); must not block."""

    def call_added(self, call: Call) -> None: ...

    def call_removed(self, call: Call) -> None: ...


RECENT_LIMIT = 1000


class CallRegistry:
    def __init__(self) -> None:
        self._live: dict[str, Call] = {}
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # Fields that replace a call's own description once it ends: an outbound call that ends
        # before the answer records its outcome here (busy, no-answer...; carriers/sip/outbound).
        self._final_fields: dict[str, dict[str, Any]] = {}
        self.total_started = 0
        self.total_rejected = 0
        self.observer: RegistryObserver | None = None
        #: What the console shows of this node's calls, live and recently ended (console/board.py).
        self.console = CallConsole()

    def add(self, call: Call) -> None:
        if call.call_ref in self._live:
            raise KeyError(f"call {call.call_ref} exists")
        self._live[call.call_ref] = call
        self.total_started += 1
        if self.observer is not None:
            self.observer.call_added(call)

    def get(self, call_ref: str) -> Call | None:
        return self._live.get(call_ref)

    def remove(self, call: Call) -> None:
        if self._live.get(call.call_ref) is call:
            del self._live[call.call_ref]
            if self.observer is not None:
                self.observer.call_removed(call)
        described = call.describe()
        described.update(self._final_fields.pop(call.call_ref, {}))
        self._recent[call.call_ref] = described
        self._recent.move_to_end(call.call_ref)
        while len(self._recent) > RECENT_LIMIT:
            self._recent.popitem(last=False)

    def set_final_fields(self, call_ref: str, fields: dict[str, Any]) -> None:
        """What the record of ``call_ref`` says once it ends (pre-answer outcomes)."""
        self._final_fields[call_ref] = dict(fields)

    def clear_final_fields(self, call_ref: str) -> None:
        self._final_fields.pop(call_ref, None)

    def describe(self, call_ref: str) -> dict[str, Any] | None:
        call = self._live.get(call_ref)
        if call is not None:
            return call.describe()
        return self._recent.get(call_ref)

    def __iter__(self) -> Iterator[Call]:
        return iter(list(self._live.values()))

    def __len__(self) -> int:
        return len(self._live)
