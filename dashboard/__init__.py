"""The local web dashboard over the run registry (`server`, page under
`static/`) and stopping a run (`stop`: a local run's process or a hosted run's
Ray job), shared with `vf-sandbox runs stop`."""
