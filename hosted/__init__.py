"""Hosted runs (`vf-sandbox eval --hosted`) on a Ray cluster: staging and
submitting the job (`submit`), the job's entrypoint on the head node (`driver`:
runs the runner, whose groups go to Ray actors, `runner.ray_workers`), the run
seen from any machine through Ray's HTTP APIs: status, logs, results, stop
(`jobs`), and the job that deletes a run's sandboxes on every node (`cleanup`)."""
