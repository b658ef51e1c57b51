import sys

from ftune.worker.main import main

sys.exit(main())
