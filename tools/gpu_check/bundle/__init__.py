"""The offline bundle (build), its steps with DALI's wheel in parts (steps), the install on the
host (install) and the steps' dry run here on the CPU (dry_run)."""
