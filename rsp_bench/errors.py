"""Errors the harness raises for bad input (files, options, records, policies).

Each names the bad value. ``HarnessInputError`` subclasses ``ValueError``; the CLI
turns it into one line on stderr and exit code 2. Must not import torch.
"""


class HarnessInputError(ValueError):
    """Bad input to the harness: a missing or malformed file, option or record."""


class RecordError(HarnessInputError):
    """A run record or baseline does not match the documented schema."""


class PolicyError(HarnessInputError):
    """A gate policy file is malformed or names an unknown direction."""
