"""vnetbench: reproducible network performance experiments on real (virtual) testbeds."""

__version__ = "0.1.0"
