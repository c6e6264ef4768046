import sys

from vnetbench.cli import main

sys.exit(main())
