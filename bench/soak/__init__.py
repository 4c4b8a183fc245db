"""The fault soak: two control-plane replicas on a private PostgreSQL and a multi-node Ray on this
machine run a stream of jobs over REST while a seeded chaos schedule injects faults; one table says
what was lost, duplicated, failed, recovered, and whether chaos-hit jobs end bit-identical to their
fault-free twins. `python -m bench.soak --minutes 30 --seed 1` (or `make soak MINUTES=30`)."""
