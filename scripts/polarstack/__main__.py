import sys

from polarstack.cli.main import main

sys.exit(main())
