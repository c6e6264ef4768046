"""The workloads: one module per tool, each registered under its ``tool`` name.

Importing this package registers every driver (see :mod:`vnetbench.workloads.base` for
what a driver declares, :mod:`vnetbench.workloads.registry` for the lookup). A new
tool is a new module here and one line below.
"""

from vnetbench.workloads import iperf3, irtt, mbw, ping, sockperf, ss, sysbench, wrk  # noqa: F401 - registers
# ab uses wrk's nginx, so importing it first would register wrk first (the registry's order is the one
# error messages list the tools in)
from vnetbench.workloads import ab  # noqa: F401 - registers
