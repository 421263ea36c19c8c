"""The clients' one context-manager protocol: ``with Client(...) as client:`` closes it on
the way out (the pattern every sync client shares)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """A client closed by ``close()``; ``with`` returns it and closes it at the end."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
