"""The offline bundle: what a GPU host without internet needs (build), its steps for a transfer
of limited size (steps, with DALI's wheel in parts: parts), the install on the host (install)
and the dry run of the steps here on the CPU (dry_run)."""
