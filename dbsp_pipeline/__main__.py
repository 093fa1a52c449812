import sys

from dbsp_pipeline.cli import main

sys.exit(main())
