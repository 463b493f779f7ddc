RatecvState = tuple[int, tuple[tuple[int, int], ...]]

def ratecv(
    data: bytes, inrate: int, outrate: int, state: RatecvState | None
) -> tuple[bytes, RatecvState]: ...
