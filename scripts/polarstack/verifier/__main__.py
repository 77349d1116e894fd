"""`python -m polarstack.verifier --problem ... --solution ... --name ...`: the verifier's command line."""

import sys

from polarstack.verifier import main

sys.exit(main())
