"""The offline bundle (build), its steps, DALI's wheel in parts and the install on the host
(steps), and the steps' dry run here on the CPU (dry_run)."""
