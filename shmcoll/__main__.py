import sys

from shmcoll.cli import main

sys.exit(main())
