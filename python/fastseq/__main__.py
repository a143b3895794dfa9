import sys

from fastseq.cli import main

sys.exit(main())
