"""The GPU check (docs/gpu-check.md): ``python -m tools.gpu_check`` (:mod:`.cli`, its flags
in :mod:`.settings`).

- the full check for a GPU machine with time (``make gpu-check``): :mod:`.full`, its rows in
  :mod:`.rows`, :mod:`.decode_rows` and :mod:`.dali_rows`, judged in :mod:`.report` and written
  by :mod:`.markdown`;
- the lease plan for a borrowed GPU's 15 minutes (``--lease``, ``make gpu-lease``): the rows and
  the clock in :mod:`.plan` (what each runs: :mod:`.lease_rows`), one call in :mod:`.lease`, the
  calls' state and archive in :mod:`.calls`, its report in :mod:`.lease_report`; rehearsed here
  by :mod:`.rehearse` (``make gpu-rehearse``);
- what every command shares: :mod:`.runner` (commands, logs, budget), :mod:`.machine` (the
  environment probe), :mod:`.install` (the bundle's wheels into one ``--target``), :mod:`.data`
  (the replicated sample and its LMDB);
- the bundle (``make gpu-bundle``): :mod:`.bundle` (wheels and sample), :mod:`.layout` (the
  device calls), :mod:`.wheel_parts` (a wheel too large for one call, in checked parts).
"""
