import sys

from svcgate.cli import main

sys.exit(main())
