"""The rows a check runs: a loader alone and ResNet-50 from it (base), DALI's (dali), the batch
decoder's (gpu_decode) and the lease plan's list of them (lease)."""
