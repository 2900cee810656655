import sys

from triskele.eval.cli import main

sys.exit(main())
