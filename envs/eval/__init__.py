"""The eval CLI's engine: config resolution (`config`), results on disk and
resume (`writer`), running and stopping (`runner`), and display (`display`).
The typer layer is `envs.cli.eval_cmd`."""
