"""What the rows run: main.py's runs, pytest, NCCL, DALI's memory and the rows' data (measure);
the host's facts, the GPU decoders' probes and the decoder named (probes)."""
