import sys

from flashrec.cli import main

sys.exit(main())
