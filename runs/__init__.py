"""The run registry (`registry`: every eval / swe-debug run, its state and
progress), result summaries read from a run's output dir (`results`) and the
diagnosis of a run that failed (`diagnose`). Shown by `vfcli` and `dashboard`."""
