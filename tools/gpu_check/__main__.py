import sys

from .cli import main_cli

sys.exit(main_cli())
