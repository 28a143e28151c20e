"""The offline bundle: what a GPU host without internet needs (build), its steps for a transfer
of limited size with DALI's wheel in parts (steps), the install on the host (install) and the
dry run of the steps here on the CPU (dry_run)."""
