"""The eval runner: the run definition, its settings and their resolution
(`config`, `options`), set-up of a
run's env and clients (`setup`), running it (`runner`: in this process, in `-w N`
worker processes (`workers`) or on Ray actors (`ray_workers`), one dispatcher),
results on disk, resume and JUnit (`writer`, `resume`, `junit`) and display
(`display`). The command line over it is `vfcli`; hosted runs are `hosted`."""
