"""What the rows run: main.py's training and loader-alone runs, pytest, NCCL and DALI's memory
(measure), the GPU decoders' probes and the decoder named (probes), the host's environment
(host) and the data the rows read (data)."""
