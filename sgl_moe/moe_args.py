"""The project's own worker flags (``--moe-*``), as one frozen dataclass."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sgl_moe.cli_args import add_dataclass_args, from_namespace

PREFIX = "moe-"


class MoeArgsError(ValueError):
    """A --moe-* flag has an invalid value or conflicts with another flag."""


@dataclass(frozen=True)
class MoeArgs:
    saturation_flops: float | None = None
    """Saturation threshold Θ in FLOPs reported to the router, overriding the worker's own value
    (until calibration exists, a placeholder: the FLOPs of one full prefill step)."""
    saturation_margin: float = 1.0
    """Safety factor applied to the worker's own Θ (not to a manual --moe-saturation-flops)."""

    def validate(self) -> None:
        if self.saturation_flops is not None and not self.saturation_flops > 0:
            raise MoeArgsError(f"--moe-saturation-flops must be positive, got {self.saturation_flops}")
        if not self.saturation_margin >= 1.0:
            raise MoeArgsError(f"--moe-saturation-margin must be >= 1.0, got {self.saturation_margin}")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_dataclass_args(parser, MoeArgs, PREFIX, "sgl_moe options (--moe-*)")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "MoeArgs":
        return from_namespace(cls, ns, PREFIX)
