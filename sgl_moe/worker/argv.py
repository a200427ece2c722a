"""A read-once view of SGLang's argv: which flags are given and their values (``--f v`` or ``--f=v``)."""

from __future__ import annotations

from collections.abc import Iterable


class ArgvView:
    """SGLang's argv, scanned once. Immutable: ``plus`` returns a new view with flags appended.

    The rules are argparse's for long options: ``--f v`` and ``--f=v`` both give ``v``; the last occurrence
    wins; ``has`` is true for a flag given in either spelling (a boolean flag has no value)."""

    def __init__(self, argv: Iterable[str] = ()) -> None:
        self.argv: tuple[str, ...] = tuple(argv)
        self._values: dict[str, tuple[int, str]] = {}
        """flag -> (position of its last occurrence, value), so the last of several aliases wins."""
        self._present: set[str] = set()
        for i, arg in enumerate(self.argv):
            if not arg.startswith("--"):
                continue
            name, eq, value = arg.partition("=")
            self._present.add(name)
            if eq:
                self._values[name] = (i, value)
            elif i + 1 < len(self.argv):
                self._values[name] = (i, self.argv[i + 1])

    def value(self, *names: str) -> str | None:
        """The value given last for any of ``names`` (aliases of one flag); None if absent."""
        given = [self._values[name] for name in names if name in self._values]
        return max(given)[1] if given else None

    def has(self, *names: str) -> bool:
        return any(name in self._present for name in names)

    def plus(self, *args: str) -> ArgvView:
        return ArgvView(self.argv + args)

    def int_value(self, *names: str, default: int) -> int:
        value = self.value(*names)
        return default if value is None else int(value)

    def __iter__(self):
        return iter(self.argv)

    def __repr__(self) -> str:
        return f"ArgvView({list(self.argv)!r})"
