import sys

from vnetbench.entry import main

sys.exit(main())
