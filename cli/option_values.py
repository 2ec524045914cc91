"""The values the command line's options take, checked by argparse before anything runs: a bad one is
refused with one line (`fuselens analyze: error: argument --peak-gbps: must be a number above 0`)."""

from __future__ import annotations

import argparse
import math

from fuselens.contracts.options import DEVICE_PROFILES


def device_name(value: str) -> str:
    """`--device`: one of the device profiles, as the settings spell it ("H100" and "h-100" too)."""
    key = value.lower().replace("-", "").replace(" ", "")
    if key not in DEVICE_PROFILES:
        raise argparse.ArgumentTypeError(f"unknown device {value!r} (use one of {', '.join(DEVICE_PROFILES)})")
    return key


def positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {value!r}")
    return number


def positive_int(value: str) -> int:
    number = _int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value!r}")
    return number


def non_negative_int(value: str) -> int:
    number = _int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value!r}")
    return number


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {value!r}") from None
