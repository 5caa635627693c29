"""Run management: the registry of eval / swe-debug runs (`registry`), the
`vf-sandbox runs ...` and `vf-sandbox dashboard` commands (`cli`), result
summaries read from a run's output dir (`results`) and the local web
dashboard (`dashboard`, page under `static/`)."""
