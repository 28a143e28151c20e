import sys

from .check import main_cli

sys.exit(main_cli())
