"""Training as users run it: ``recipes`` (torchvision's recipes through main.py, the targets
printed), ``stop_agreement`` (host time per step of the distributed stop agreement)."""
