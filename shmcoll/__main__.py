import sys

from shmcoll.tools.cli import main

sys.exit(main())
