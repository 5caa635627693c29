"""Contract fakes of remote sandbox services (Kubernetes API server, Prime API) for tests and benchmarks."""
