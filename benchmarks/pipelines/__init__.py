"""The decode-on-device pipelines: ``gpu_decode`` (``--decode-device`` beside the CPU loaders),
``dali_feed`` (``--dali``'s feed on the training thread), ``dali_cpu`` (DALI's CPU pipeline
stage by stage)."""
