"""``python -m interp_seal.cli`` is ``interp-seal`` (for launchers such as torchrun)."""

import sys

from interp_seal.cli import main

sys.exit(main())
