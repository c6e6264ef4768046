"""Errors meant for people: each says what is wrong and what to do about it."""


class VnetbenchError(Exception):
    """Base class: the CLI prints the message (no traceback) and exits 2."""


class ScenarioError(VnetbenchError):
    """A scenario file (or --set override) that cannot be run as written."""


class EnvironmentProblem(VnetbenchError):
    """The machine lacks something the run needs (root, a tool, a qdisc)."""


class LabError(VnetbenchError):
    """Building or configuring the lab failed."""


class EnvironmentUnavailable(LabError):
    """One environment variant of the lab could not be brought up (a guest that did not boot).

    The rest of the lab is fine: the variant's trials fail with this message, and the
    files in ``evidence`` (console logs) are kept next to the results database."""

    def __init__(self, message: str, evidence: list | None = None):
        super().__init__(message)
        self.evidence = list(evidence or [])


class PathNotAsDeclared(LabError):
    """The lab's path, read back and probed before a configuration's trial, is not what the configuration
    declares (even after it was made again from scratch): the trial fails with ``problems`` as its reason."""

    def __init__(self, problems: list[str]):
        super().__init__("the path is not as declared: " + "; ".join(problems))
        self.problems = list(problems)


class StoreError(VnetbenchError):
    """The results database cannot answer (unknown run id, wrong file)."""


class HostError(VnetbenchError):
    """A remote host cannot be reached, refused us, or cannot do what was asked. ``fix`` says what to do,
    on its own, for tables that show it apart from the message."""

    def __init__(self, message: str, fix: str = ""):
        super().__init__(f"{message}; {fix}" if fix else message)
        self.reason = message
        self.fix = fix


class PlaceGone(EnvironmentProblem):
    """Part of the place a run happens at went away and did not come back in time: the run stops, resumable."""


class HostsGone(PlaceGone):
    """A host of a `run --hosts` dropped out and did not come back in time: the run stops, resumable."""
