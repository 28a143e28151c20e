"""The GPU check (docs/gpu-check.md): its command line and runner (:mod:`.check`), the rows in
priority order (:mod:`.plan`), the report (:mod:`.report`), what the rows run (:mod:`.rows`),
the offline bundle, its steps, the install and the steps' dry run (:mod:`.bundle`)."""
