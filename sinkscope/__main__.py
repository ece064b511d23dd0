import sys

from sinkscope.cli import main

sys.exit(main())
