"""The GPU check (docs/gpu-check.md), ``python -m tools.gpu_check``: the full check (``make
gpu-check``, :mod:`.full`), the lease plan for a borrowed GPU's 15 minutes (``--lease``,
:mod:`.plan`, :mod:`.lease`; rehearsed by :mod:`.rehearse`) and the bundle they run from
(``make gpu-bundle``, :mod:`.bundle`)."""
