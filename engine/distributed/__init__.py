"""A distributed run: process launch, the process group and its collectives (processes), a
process's place in a SLURM step and requeueing (slurm), and stopping every rank on the
scheduler's signal with nothing lost (preempt)."""
