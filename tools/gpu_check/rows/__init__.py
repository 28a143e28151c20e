"""What the rows run: main.py's training and loader-alone runs, pytest, NCCL, DALI's memory and
the rows' data (measure); the host's environment, the GPU decoders' probes and the decoder
named (probes)."""
