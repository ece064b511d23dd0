import sys

from sinkscope.cli.entry import main

sys.exit(main())
