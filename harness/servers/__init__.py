"""Server processes: launch, health-wait and stop process groups; the guard under command
servers; the HF reference and its HTTP server."""
