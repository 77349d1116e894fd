import sys

from polarstack.cli import main

sys.exit(main())
