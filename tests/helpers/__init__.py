"""What several test modules share (no test module imports another): paths, loader helpers,
small training runs, runs watched from outside (exits.py), processes, data stores, bad and odd
images, a generated stand-in for the real sample (standin.py), a real SLURM, fake GPU runs."""
