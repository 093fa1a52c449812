import os
import sys

from dbsp_pipeline.cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:  # the reader of the output stopped reading (``verify --json | head``)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
    code = 141  # as a shell reports a process a SIGPIPE ended (not 1: "damaged", for verify)
sys.exit(code)
