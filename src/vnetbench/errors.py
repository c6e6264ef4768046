"""Errors meant for people: each says what is wrong and what to do about it."""


class VnetbenchError(Exception):
    """Base class: the CLI prints the message (no traceback) and exits 2."""


class ScenarioError(VnetbenchError):
    """A scenario file (or --set override) that cannot be run as written."""


class EnvironmentProblem(VnetbenchError):
    """The machine lacks something the run needs (root, a tool, a qdisc)."""


class LabError(VnetbenchError):
    """Building or configuring the lab failed."""


class StoreError(VnetbenchError):
    """The results database cannot answer (unknown run id, wrong file)."""
