from .check import main_cli

raise SystemExit(main_cli())
