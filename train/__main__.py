import sys

from triskele.train.cli import main

sys.exit(main())
