"""Scenarios: the model (model.py), loading files and --set (load.py), expanding the matrix (plan.py)."""

from vnetbench.limits import CONFIGURATIONS

#: A matrix larger than this is refused before it is expanded (`--max-configurations` raises it): see limits.py.
#: (Here, not in plan.py, so that the CLI's parser can name it without importing the scenario model.)
MAX_CONFIGURATIONS = CONFIGURATIONS.value
