"""The call's ears (calls/listening.py) in virtual time: a real ``Call`` on a gateway that is not
started, the real VAD and turn detector, and a ``LocalSttStream`` whose decodes finish when the
test says, standing in for a decoder slowed by a loaded machine (docs/turn-taking.md, "The
rules", 5)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from appbridge.calls.listening import Ears
from appbridge.media.codecs import PCMU_8K, AudioFormat
from appbridge.speech.providers.local_stt import LocalSttStream, Recognition
from tests.unit.test_local_stt import (
    FakeEngine,
    ScriptedSegmenter,
    silence,
    telephone_speech,
    utterance,
)
from tests.unit.test_transfer_engine import FakeLeg, Rig, open_rig, settle

EARS_8K = AudioFormat("pcm16", 8000)


class ScriptedProvider:
    """Opens one ``LocalSttStream`` on the test's engine and segmenter."""

    name = "local"

    def __init__(self) -> None:
        self.engine = FakeEngine()
        self.segmenter = ScriptedSegmenter()

    def languages(self) -> Sequence[str]:
        return ["en"]

    async def open_stream(
        self, language: str, rate_hz: int, hints: Sequence[str]
    ) -> LocalSttStream:
        loop = asyncio.get_running_loop()
        return LocalSttStream(self.engine, loop, language, rate_hz, [], self.segmenter)


async def hear(rig: Rig, ears: Ears, pcm16: bytes) -> None:
    """``pcm16`` (8 kHz) as 20 ms frames, each arriving 20 ms of virtual time after the last."""
    step = EARS_8K.frame_bytes(20)
    for i in range(0, len(pcm16) - step + 1, step):
        rig.clock.advance(0.02)
        ears.on_frames([pcm16[i : i + step]])
        await settle()


async def test_a_turn_waits_for_the_final_its_stt_is_still_decoding() -> None:
    provider = ScriptedProvider()
    engine, segmenter = provider.engine, provider.segmenter
    async with open_rig(FakeLeg()) as rig:
        ears = Ears(rig.call, provider, PCMU_8K, language="en-US", patience="low")
        ears.open()
        await settle()
        segmenter.next = [utterance(0, False)]
        await hear(rig, ears, silence(200) + telephone_speech("Do you have any appointments"))
        engine.jobs[0][1].set_result(Recognition("you can be", 0.4))  # the preview
        await settle()
        assert rig.link.of_type("turn.user_started")
        segmenter.next = [utterance(0, True)]  # the endpoint: the final is asked for
        await hear(rig, ears, silence(20))
        assert ears.stream is not None and ears.stream.finals_owed == 1
        # Four seconds of silence: past the wait plus the 1.5 s that bound a missing final.
        await hear(rig, ears, silence(4000))
        assert rig.link.of_type("turn.ended") == []
        engine.jobs[1][1].set_result(Recognition("do you have any appointments", 0.8))
        await settle()
        ended = rig.link.of_type("turn.ended")
        assert [e["text"] for e in ended] == ["do you have any appointments"]
        await ears.close()
