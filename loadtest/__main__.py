import sys

from loadtest.loadtest_cli import main

sys.exit(main())
