"""The sample-rate converter of the media path: mono signed 16-bit PCM from one rate to another.

:func:`ratecv` is the compiled one (appbridge/media/_ratecv.c) when the package was built with a
C compiler, else ``audioop.ratecv``. Both give the same samples and keep the same state
(``tests/unit/test_resample.py`` checks it on every ratio the gateway uses), so which one runs
changes the speed only: the compiled one takes 0.6-0.7 µs for a 20 ms frame between 8 and
16 kHz where audioop takes 2.2-3.7 µs, and a frame of every call goes through it each way.
Neither filters: going down in rate, :class:`~appbridge.media.codecs.Converter` runs
:mod:`appbridge.media.antialias`'s low-pass filter first.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    # Deprecated in 3.11/3.12, removed in 3.13 (where `audioop-lts` provides it): noise here.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = ["COMPILED", "RatecvState", "ratecv"]

RatecvState = tuple[int, tuple[tuple[int, int], ...]]

try:
    from appbridge.media._ratecv import ratecv

    COMPILED = True
except ImportError:  # installed without a C compiler (setup.py: the extension is optional)
    COMPILED = False

    def ratecv(
        data: bytes, inrate: int, outrate: int, state: RatecvState | None
    ) -> tuple[bytes, RatecvState]:
        """``audioop.ratecv(data, 2, 1, inrate, outrate, state)``."""
        out, new_state = audioop.ratecv(data, 2, 1, inrate, outrate, state)
        return out, new_state
