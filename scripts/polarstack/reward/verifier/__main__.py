"""`python -m polarstack.reward.verifier --problem ... --solution ... --name ...`: the verifier's command line."""

import sys

from polarstack.reward.verifier import main

sys.exit(main())
