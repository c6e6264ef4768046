"""Scenarios: the model (model.py), loading files and --set (load.py), expanding the matrix (plan.py)."""

#: A matrix larger than this is refused before it is expanded (`--max-configurations` raises it): a typo such as
#: an axis of 200 values too many would otherwise take minutes and gigabytes to expand, then days to run.
#: (Here, not in plan.py, so that the CLI's parser can name it without importing the scenario model.)
MAX_CONFIGURATIONS = 10_000
