"""The lease plan (make gpu-lease, gpu-rehearse): the calls planned against the machine time
left (plan, calls), each call run (run), its report (report) and the rehearsal here (rehearse)."""
