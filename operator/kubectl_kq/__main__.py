"""``python -m kubectl_kq``: the same as ``kubectl-kq``."""

import sys

from kubectl_kq.cli import main

sys.exit(main())
