"""What is sent and how: SIDs, prompts (workload), one request per protocol (client), the
load loops."""
